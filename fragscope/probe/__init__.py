"""In-process PyTorch allocator probe (placeholder until the live issue lands)."""


def launcher_main() -> None:
    raise SystemExit("fragscope-probe: not implemented yet")
