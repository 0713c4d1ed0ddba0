"""What ``fragscope mcp`` may read and reach: files under ``--allow-dir`` only, hosts in ``--allow-url`` only.

The caller is a language model, which follows instructions it finds in data; so every path and URL it hands
over is checked here, and checked again where the bytes are actually read or the connection actually made:

- **Files.** A path is walked one component at a time from an allowed directory, each opened with
  ``O_NOFOLLOW`` relative to its parent's descriptor (``openat``): a symbolic link is read and resolved here,
  and refused when it leads out of the allowed directory; ``..`` never climbs above it. While the server
  runs, the project's safe opener (:mod:`fragscope.collectors.safefile`) opens every input through the same
  walk (:func:`install`), so a path swapped for a link between the check and the read is refused too.
- **Network.** A URL's host must be named by ``--allow-url`` (a host, ``host:port``, a URL, an address or a
  network such as ``10.0.0.0/8``), and every address it resolves to must be allowed. An audit hook
  (``sys.addaudithook``) checks the address of every ``socket.connect`` the process makes while the policy is
  installed, so a redirect to another host, a DNS answer that changed, or a library's own connection cannot
  reach an address the operator did not allow. Link-local addresses (169.254.0.0/16, fe80::/10: the cloud
  metadata services) are refused unless an address or network rule names them explicitly.

No SDK import here: the CLI and the tests use this module without the ``mcp`` extra.
"""
from __future__ import annotations

import errno
import ipaddress
import os
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

DEFAULT_MAX_FILE_BYTES = 256 << 20  # a day's recording is ~60 MB, a large nsys export a few hundred MB
_MAX_LINKS = 40  # symbolic links followed in one path (Linux's own limit)
# Cloud metadata services outside 169.254.0.0/16: AWS IMDS over IPv6, Alibaba Cloud.
_METADATA = (ipaddress.ip_network("fd00:ec2::254/128"), ipaddress.ip_network("100.100.100.200/32"))


class PolicyError(Exception):
    """A path or URL the operator did not allow; ``str(e)`` is one line saying why and how to allow it."""


@dataclass(frozen=True)
class UrlRule:
    """One ``--allow-url`` entry: a host name (with an optional port and scheme) or a network."""

    text: str
    host: str | None = None  # lower-case host name or address literal
    port: int | None = None
    scheme: str | None = None
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None

    @classmethod
    def parse(cls, text: str) -> "UrlRule":
        t = text.strip()
        if not t:
            raise PolicyError("--allow-url: empty value")
        try:  # a network or an address: 10.0.0.0/8, 127.0.0.1, ::1
            return cls(text=t, network=ipaddress.ip_network(t, strict=False))
        except ValueError:
            pass
        parts = urlsplit(t if "://" in t else "http://" + t)
        scheme = parts.scheme.lower() if "://" in t else None
        if scheme not in (None, "http", "https") or not parts.hostname:
            raise PolicyError(f"--allow-url {t!r}: expected a host, host:port, http(s)://host:port or a network "
                              "such as 10.0.0.0/8")
        try:
            port = parts.port
        except ValueError:
            raise PolicyError(f"--allow-url {t!r}: bad port") from None
        host = parts.hostname.lower()
        try:  # an address literal with a port: http://127.0.0.1:8000
            net = ipaddress.ip_network(host)
        except ValueError:
            net = None
        return cls(text=t, host=host, port=port, scheme=scheme, network=net)

    def port_ok(self, port: int) -> bool:
        return self.port is None or self.port == port


@dataclass
class Policy:
    """The operator's allowances and the caps of one ``fragscope mcp`` server."""

    allow_dirs: list[str] = field(default_factory=list)  # real paths, no symlinks
    allow_urls: list[UrlRule] = field(default_factory=list)
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    spellings: dict = field(default_factory=dict)  # real path -> the absolute spellings it was given as
    _dns: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def build(cls, allow_dirs=(), allow_urls=(), max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> "Policy":
        dirs: list[str] = []
        spellings: dict[str, list[str]] = {}
        for d in allow_dirs:
            real = os.path.realpath(d)
            if not os.path.isdir(real):
                raise PolicyError(f"--allow-dir {d}: not a directory")
            if real not in dirs:
                dirs.append(real)
            names = spellings.setdefault(real, [real])
            if os.path.abspath(d) not in names:  # ./incidents given as a link: its own spelling works too
                names.append(os.path.abspath(d))
        return cls(allow_dirs=dirs, allow_urls=[UrlRule.parse(u) for u in allow_urls], max_file_bytes=max_file_bytes,
                   spellings=spellings)

    # --- files -----------------------------------------------------------------------------------
    def how_to_allow_dirs(self) -> str:
        if not self.allow_dirs:
            return ("no directory is allowed: the operator starts the server with --allow-dir DIR "
                    "(e.g. fragscope mcp --allow-dir ./incidents) to let it read files there")
        return "allowed directories: " + ", ".join(self.allow_dirs)

    def resolve_file(self, path: str) -> tuple[str, os.stat_result]:
        """(real path, stat) of ``path``, a regular file inside an allowed directory and within the size cap.
        A relative path is looked up in each allowed directory in turn."""
        if not isinstance(path, str) or not path.strip():
            raise PolicyError("give a file path")
        if "\x00" in path:
            raise PolicyError("a path with a NUL byte")
        if not self.allow_dirs:
            raise PolicyError(f"{path}: refused: {self.how_to_allow_dirs()}")
        last: PolicyError | None = None
        for root, rel in self._candidates(path):
            try:
                fd, real = self._walk(root, rel, path)
            except FileNotFoundError:
                last = PolicyError(f"{path}: no such file in {root}")
                continue
            try:
                st = os.fstat(fd)
            finally:
                os.close(fd)
            if not stat.S_ISREG(st.st_mode):
                from ..collectors.safefile import kind_of

                raise PolicyError(f"{path}: {kind_of(st.st_mode)}, not a regular file")
            if st.st_size > self.max_file_bytes:
                raise PolicyError(f"{path}: {st.st_size} bytes, over the server's {self.max_file_bytes} byte cap "
                                  "(--max-file-bytes)")
            return real, st
        if last is not None:
            raise last
        raise PolicyError(f"{path}: refused: outside the allowed directories ({', '.join(self.allow_dirs)}); "
                          "the operator allows a directory with --allow-dir DIR")

    def _candidates(self, path: str) -> list[tuple[str, list[str]]]:
        out = []
        if os.path.isabs(path):
            norm = os.path.normpath(path)
            for root in self.allow_dirs:
                for spelling in self.spellings.get(root, [root]):
                    if norm == spelling or norm.startswith(spelling.rstrip("/") + "/"):
                        out.append((root, _parts(os.path.relpath(norm, spelling))))
                        break
            return out
        parts = _parts(path)
        if parts and parts[0] == "..":
            return []
        return [(root, parts) for root in self.allow_dirs]

    def _walk(self, root: str, parts: list[str], shown: str) -> tuple[int, str]:
        """Open ``root/parts`` without following a link out of ``root``: (descriptor, real path). Each
        directory stays open while the walk is below it, so ``..`` returns to the very directory it left."""
        cloexec = getattr(os, "O_CLOEXEC", 0)
        flags = os.O_RDONLY | cloexec | getattr(os, "O_NOFOLLOW", 0)
        links = 0
        todo = list(parts)
        names: list[str] = []  # components below root, none of them a link
        fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | cloexec)]
        try:
            while todo:
                name = todo.pop(0)
                if name in ("", "."):
                    continue
                if name == "..":
                    if not names:
                        raise PolicyError(f"{shown}: refused: it leads out of {root}")
                    names.pop()
                    os.close(fds.pop())
                    continue
                last = not todo
                try:
                    nfd = os.open(name, flags | (os.O_NONBLOCK if last else os.O_DIRECTORY), dir_fd=fds[-1])
                except OSError as e:
                    if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                        raise
                    try:
                        target = os.readlink(name, dir_fd=fds[-1])
                    except OSError:
                        raise e from None  # ENOTDIR of a plain file in the middle of the path
                    links += 1
                    if links > _MAX_LINKS:
                        raise PolicyError(f"{shown}: too many symbolic links") from None
                    if os.path.isabs(target):
                        t = os.path.normpath(target)
                        if not (t == root or t.startswith(root.rstrip("/") + "/")):
                            raise PolicyError(f"{shown}: refused: a symbolic link leads out of {root} "
                                              f"(to {target})") from None
                        todo = _parts(os.path.relpath(t, root)) + todo
                        while len(fds) > 1:  # back to the root
                            os.close(fds.pop())
                        names = []
                    else:
                        todo = _parts(target) + todo  # relative to the link's directory: the walk goes on there
                    continue
                fds.append(nfd)
                names.append(name)
            if not names:
                raise PolicyError(f"{shown}: a directory, not a file")
            fd = fds.pop()
            return fd, os.path.join(root, *names)
        finally:
            for f in fds:
                os.close(f)

    def open_confined(self, path: str) -> int:
        """A descriptor of ``path`` (O_NONBLOCK, as the safe opener wants) through the walk; PermissionError
        (an OSError every reader already turns into its one-line message) when it is not allowed."""
        if not self.allow_dirs:
            raise PermissionError(errno.EACCES, "refused by fragscope mcp: no --allow-dir")
        norm = os.path.normpath(os.path.abspath(path))
        for root in self.allow_dirs:
            if norm == root or norm.startswith(root.rstrip("/") + "/"):
                try:
                    fd, _ = self._walk(root, _parts(os.path.relpath(norm, root)), path)
                except PolicyError as e:
                    raise PermissionError(errno.EACCES, f"refused by fragscope mcp ({e})") from None
                return fd
        raise PermissionError(errno.EACCES, "refused by fragscope mcp: outside --allow-dir")

    # --- network ---------------------------------------------------------------------------------
    def how_to_allow_urls(self) -> str:
        if not self.allow_urls:
            return ("no host is allowed: the operator starts the server with --allow-url URL "
                    "(e.g. fragscope mcp --allow-url http://127.0.0.1:8000)")
        return "allowed: " + ", ".join(r.text for r in self.allow_urls)

    def check_url(self, url: str) -> str:
        """The URL as given (``host:port`` gets ``http://``) when its host and every address it resolves to
        are allowed; else PolicyError saying why."""
        if not isinstance(url, str) or not url.strip():
            raise PolicyError("give a URL (http://host:port)")
        u = url.strip()
        if any(c in u for c in "\x00\r\n\t "):
            raise PolicyError(f"{u!r}: a URL with blanks or control characters")
        full = u if "://" in u else "http://" + u
        parts = urlsplit(full)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"{u}: not an http(s) URL")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise PolicyError(f"{u}: bad port") from None
        host = parts.hostname.lower()
        try:
            literal = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None and _link_local(literal) and not self._explicit(literal, port):
            raise PolicyError(f"{u}: refused: {host} is a link-local address (cloud metadata service); "
                              "it is reached only when --allow-url names that address or network")
        named = [r for r in self.allow_urls if r.host == host and r.port_ok(port)
                 and (r.scheme is None or r.scheme == scheme)]
        if not named and literal is None and not any(r.network is not None and r.host is None
                                                      for r in self.allow_urls):
            raise PolicyError(f"{u}: refused: host {host} is not allowed ({self.how_to_allow_urls()})")
        addrs = self._resolve(host, port)
        if not addrs:
            raise PolicyError(f"{u}: cannot resolve host {host}")
        for a in addrs:
            if not self.address_allowed(a, port, named_host=host if named else None):
                why = ("a link-local address (cloud metadata service)" if _link_local(ipaddress.ip_address(a))
                       else "not an allowed address")
                raise PolicyError(f"{u}: refused: {host} resolves to {a}:{port}, {why} ({self.how_to_allow_urls()})")
        return full

    def address_allowed(self, addr: str, port: int, named_host: str | None = None) -> bool:
        """May the process connect to ``addr:port``? By a network/address rule, or by a host rule whose
        name resolves to it. Link-local and metadata addresses only by an explicit address/network rule."""
        try:
            ip = ipaddress.ip_address(addr.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if self._explicit(ip, port):
            return True
        if _link_local(ip):
            return False
        for r in self.allow_urls:
            if r.network is None and r.host and r.port_ok(port) and (named_host is None or r.host == named_host):
                if addr in self._resolve(r.host, port) or str(ip) in self._resolve(r.host, port):
                    return True
        return False

    def _explicit(self, ip, port: int) -> bool:
        """An address/network rule covers ``ip``; for a link-local or metadata address, only a rule that lies
        within that space itself (169.254.169.254/32, 169.254.0.0/16), never a wide one such as 0.0.0.0/0."""
        ll = _link_local(ip)
        return any(r.network is not None and ip.version == r.network.version and ip in r.network and r.port_ok(port)
                   and (not ll or _link_local(r.network.network_address) and _link_local(r.network.broadcast_address))
                   for r in self.allow_urls)

    def _resolve(self, host: str, port: int) -> list[str]:
        """Addresses of ``host`` (cached 30 s); an address literal is itself."""
        try:
            return [str(ipaddress.ip_address(host))]
        except ValueError:
            pass
        key = host
        now = time.monotonic()
        with self._lock:
            hit = self._dns.get(key)
            if hit and now - hit[0] < 30.0:
                return hit[1]
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addrs = sorted({i[4][0] for i in infos})
        except (OSError, UnicodeError):
            addrs = []
        with self._lock:
            self._dns[key] = (now, addrs)
        return addrs


def _parts(rel: str) -> list[str]:
    return [p for p in rel.replace("\\", "/").split("/") if p not in ("", ".")]


def _link_local(ip) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_link_local or any(ip.version == n.version and ip in n for n in _METADATA)


# --- enforcement where the bytes are read and the connections made -----------------------------------
_ACTIVE: Policy | None = None
_HOOKED = False


def _audit(event: str, args) -> None:
    pol = _ACTIVE
    if pol is None:
        return
    if event == "sqlite3.connect":  # the Nsight Systems reader: SQLite opens by path, so check it again here
        _check_sqlite(pol, args[0] if args else None)
        return
    if event != "socket.connect":
        return
    sock, address = args[0], args[1]
    family = getattr(sock, "family", None)
    if family == socket.AF_UNIX:
        raise PermissionError(errno.EACCES, "fragscope mcp: connections to local sockets are refused")
    if family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple) and len(address) >= 2:
        host, port = str(address[0]), int(address[1])
        if not pol.address_allowed(host, port):
            raise PermissionError(errno.EACCES, f"fragscope mcp: {host}:{port} is not an allowed address "
                                                "(--allow-url)")


def _check_sqlite(pol: Policy, database) -> None:
    from urllib.parse import unquote, urlsplit as _split

    db = os.fsdecode(database) if isinstance(database, (bytes, os.PathLike)) else str(database or "")
    if db in ("", ":memory:"):
        return
    path = unquote(_split(db).path) if db.startswith("file:") else db
    fd = pol.open_confined(path)  # PermissionError when not allowed: sqlite3.connect fails with it
    os.close(fd)


def install(policy: Policy) -> None:
    """Enforce ``policy`` in this process: every input the readers open goes through its walk, every
    socket connection through its address check. :func:`uninstall` lifts it (the audit hook stays, idle)."""
    global _ACTIVE, _HOOKED
    from ..collectors import safefile

    if not _HOOKED:
        sys.addaudithook(_audit)  # cannot be removed: it does nothing while no policy is installed
        _HOOKED = True
    _ACTIVE = policy
    safefile.set_confinement(policy.open_confined)


def uninstall() -> None:
    global _ACTIVE
    from ..collectors import safefile

    _ACTIVE = None
    safefile.set_confinement(None)


def active() -> Policy | None:
    return _ACTIVE
