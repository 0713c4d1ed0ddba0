"""/metrics pasted into bug reports: real pastes (tests/data/collectors/pastes/SOURCES.md) and the damage
pasting does (HTML escapes, wrapped lines, CRLF, quotes, fences, prompts), each read back to the values
of the clean scrape."""
from __future__ import annotations

import html
import os
import textwrap

import pytest

from fragscope.collectors.exposition import ParseError, read_recording

DATA = os.path.join(os.path.dirname(__file__), "data", "collectors")
PASTES = os.path.join(DATA, "pastes")
V1 = os.path.join(DATA, "vllm_v1_cncf_kops.metrics.txt")
T = 1_800_000_000.0


def _values(w) -> dict:
    return {k: s.values.tolist() for k, s in w.series.items()}


def _write(tmp_path, name, text, newline=None):
    p = tmp_path / name
    with open(p, "w", newline=newline) as fh:
        fh.write(text)
    return str(p)


# --- real pastes: hand-checked values -----------------------------------------------------------
@pytest.mark.parametrize("name,series,labels,value,n_series", [
    # markdown quote, "# " eaten: 11 samples, python_info{...} 1.0
    ("vllm_issue7782_quoted_no_hash.paste.txt", "python_gc_collections_total", {"generation": "2"}, 79.0, 11),
    # V0 names, cut inside the last sample: 7 complete samples
    ("production_stack_issue318_truncated.paste.txt", "vllm:gpu_cache_usage_perc",
     {"model_name": "Qwen/Qwen2.5-Coder-32B-Instruct"}, 0.0, 7),
    # V1 in a ```bash fence, cut inside a # HELP
    ("production_stack_issue617_v1_fenced.paste.txt", "vllm:kv_cache_usage_perc",
     {"engine": "0", "model_name": "zai-org/GLM-4.5"}, 9.75010481363281e-06, 5),
    # fence + "$ curl -X POST ..." prompt line
    ("sglang_pr1853_prompt_fence.paste.txt", "sglang:max_running_requests",
     {"name": "/shared/public/elr-models/meta-llama/Llama-3.2-3B/5cc0ffe09ee49f7be6ca7c794ee6bd7245e84e60/"},
     2231.0, 5),
    # a prose line before the output
    ("vllm_issue26762_prose_unfenced.paste.txt", "process_virtual_memory_bytes", {}, 1.1701968896e10, 11),
    # Triton 20.03: prose, a bare "curl ..." line, families with HELP/TYPE and no samples, one gauge
    ("triton_issue2755_prose_curl.paste.txt", "nv_gpu_utilization",
     {"gpu_uuid": "GPU-d4d0dbb0-037e-652e-6df4-a742b597738c"}, 0.12, 1),
    # a fence and a "❯ curl" prompt
    ("triton_issue7583_fancy_prompt.paste.txt", "nv_inference_request_failure",
     {"model": "llama2", "reason": "REJECTED", "version": "1"}, 0.0, 12),
    # inline code: the paste starts with a backtick
    ("triton_issue6448_inline_code.paste.txt", "nv_inference_request_duration_us",
     {"model": "triton-vllm-code-llama-model", "version": "1"}, 2885180.0, 5),
    # <details><summary>...</summary> and a fence around it
    ("prometheus_docs_pr1953_details.paste.txt", "nv_inference_request_success",
     {"gpu_uuid": "GPU-a763c375-aefc-7f0c-76da-1c5554011402", "model": "inception_v3", "version": "42"}, 54.0, 2),
    # TGIS: label values holding braces and quotes ("{'method': 'prefill'}")
    ("tgis_ibm_vllm_pr18_brace_labels.paste.txt", "tgi_batch_inference_duration_bucket",
     {"le": "0.05", "method": "{'method': 'prefill'}"}, 211.0, 15),
])
def test_real_pastes(name, series, labels, value, n_series):
    w = read_recording(os.path.join(PASTES, name), scrape_time=T)
    assert w.timestamps == "none" and w.scrapes == 1
    (s,) = [x for x in w.select(series) if dict(x.key.labels) == labels]
    assert s.values.tolist() == [value]
    assert len(w) == n_series


def test_real_paste_notes_say_what_was_skipped():
    w = read_recording(os.path.join(PASTES, "production_stack_issue318_truncated.paste.txt"), scrape_time=T)
    assert any("cut short" in n and "vllm:gpu_prefix" in n for n in w.notes)
    w = read_recording(os.path.join(PASTES, "vllm_issue26762_prose_unfenced.paste.txt"), scrape_time=T)
    assert any("1 unparsable lines skipped" in n and "When I run" in n for n in w.notes)
    w = read_recording(os.path.join(PASTES, "sglang_pr1853_prompt_fence.paste.txt"), scrape_time=T)
    assert not any("unparsable" in n for n in w.notes)  # the fence and the prompt are not errors
    assert w.select("sglang:context_len")[0].values.tolist() == [131072.0]
    for name in ("prometheus_docs_pr1953_details.paste.txt", "triton_issue7583_fancy_prompt.paste.txt"):
        w = read_recording(os.path.join(PASTES, name), scrape_time=T)
        assert not any("unparsable" in n for n in w.notes), (name, w.notes)  # <details>, fences, prompts
    w = read_recording(os.path.join(PASTES, "triton_issue6448_inline_code.paste.txt"), scrape_time=T)
    assert w.select("nv_inference_request_success")[0].type == "counter"  # the backticked # TYPE was read


# --- damage done by pasting, on the real V1 scrape ----------------------------------------------
@pytest.fixture(scope="module")
def clean():
    with open(V1) as fh:
        text = fh.read()
    return text, _values(read_recording(V1, scrape_time=T))


def test_html_escaped(tmp_path, clean):
    text, want = clean
    esc = html.escape(text, quote=True)  # " -> &quot;  > -> &gt;  & -> &amp;
    assert "&quot;" in esc
    assert _values(read_recording(_write(tmp_path, "esc.txt", esc), scrape_time=T)) == want


def test_wrapped_at_80_columns_like_a_terminal(tmp_path, clean):
    text, want = clean
    wrapped = "\n".join(line[i:i + 80] for line in text.splitlines() for i in range(0, max(len(line), 1), 80))
    assert wrapped.count("\n") > text.count("\n") + 100  # many samples were split
    w = read_recording(_write(tmp_path, "wrap.txt", wrapped), scrape_time=T)
    assert _values(w) == want
    assert any("split over two lines" in n and "joined" in n for n in w.notes)


def test_wrapped_at_a_space_like_a_browser(tmp_path, clean):
    text, want = clean
    out = []
    for line in text.splitlines():
        if not line.startswith("#") and "} " in line:
            a, b = line.rsplit("} ", 1)
            out += [a + "}", b]  # the value lands on its own line
        else:
            out.append(line)
    assert _values(read_recording(_write(tmp_path, "wrap2.txt", "\n".join(out)), scrape_time=T)) == want


def test_crlf_quote_indent_nbsp_fence(tmp_path, clean):
    text, want = clean
    for variant in (
        text.replace("\n", "\r\n"),
        "".join("> " + ln for ln in text.splitlines(True)),
        textwrap.indent(text, "    "),
        text.replace(" ", "\u00a0", 3),
        "Here is what I get:\n```text\n$ curl -s localhost:8000/metrics\n" + text + "```\n...\nThanks!\n",
        "\ufeff" + text,
    ):
        assert _values(read_recording(_write(tmp_path, "v.txt", variant, newline=""), scrape_time=T)) == want


def test_garbage_is_still_refused(tmp_path):
    prose = "\n".join(f"This is line {i} of a long story, not metrics." for i in range(40))
    with pytest.raises(ParseError, match="not Prometheus/OpenMetrics text"):
        read_recording(_write(tmp_path, "prose.txt", prose))
    # a scrape drowned in prose: more than a few bad lines and more than 5 % is refused
    with open(V1) as fh:
        head = "".join(fh.readlines()[:40])
    with pytest.raises(ParseError, match="unparsable"):
        read_recording(_write(tmp_path, "mixed.txt", head + prose))


def test_escaped_and_wrapped_together(tmp_path, clean):
    text, want = clean
    esc = html.escape(text, quote=True)
    wrapped = "\n".join(line[i:i + 100] for line in esc.splitlines() for i in range(0, max(len(line), 1), 100))
    assert _values(read_recording(_write(tmp_path, "both.txt", wrapped), scrape_time=T)) == want
