"""Writes the synthetic log fixtures of this folder (own ids and numbers, line shapes of vLLM V0/V1 and SGLang).

Run from this folder: python make_fixtures.py. The line shapes follow vLLM's and SGLang's own log output
(the real logs in ../README_logs.md show the same shapes); no line is copied from them.
"""
import datetime as dt
import random

random.seed(7)


def v0() -> None:
    L = [
        "INFO 12-31 23:58:01 api_server.py:528] vLLM API server version 0.6.3",
        "INFO 12-31 23:58:01 api_server.py:529] args: Namespace(host=None, port=8000, model='/models/llama-2-7b', "
        "max_model_len=4096, tensor_parallel_size=1, block_size=16, gpu_memory_utilization=0.9, kv_cache_dtype='auto', "
        "swap_space=4)",
        "INFO 12-31 23:58:09 model_runner.py:1067] Loading model weights took 12.5523 GB",
        "INFO 12-31 23:58:10 worker.py:262] Memory profiling results: total_gpu_memory=79.15GiB initial_memory_usage=13.09GiB "
        "peak_torch_memory=13.95GiB non_torch_memory=0.54GiB kv_cache_size=56.75GiB gpu_memory_utilization=0.90",
        "INFO 12-31 23:58:11 gpu_executor.py:122] # GPU blocks: 7264, # CPU blocks: 512",
        "INFO 12-31 23:58:11 gpu_executor.py:126] Maximum concurrency for 4096 tokens per request: 28.38x",
        "INFO 12-31 23:58:30 model_runner.py:1523] Graph capturing finished in 19 secs.",
    ]
    t = dt.datetime(2025, 12, 31, 23, 59, 0)
    cum = rid = n = 0
    while t <= dt.datetime(2026, 1, 1, 0, 2, 0):
        busy = t >= dt.datetime(2025, 12, 31, 23, 59, 30)
        storm = dt.datetime(2026, 1, 1, 0, 0, 0) <= t <= dt.datetime(2026, 1, 1, 0, 1, 30)
        if storm:
            for _ in range(12):  # 12 preemptions per 5-s stats interval; V0 warns on the 1st and every 50th
                cum += 1
                rid += 1
                if cum == 1 or cum % 50 == 1:
                    L.append(f"WARNING {t:%m-%d %H:%M:%S} scheduler.py:1481] Sequence group cmpl-{rid:08x}-0 is preempted "
                             "by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect "
                             "the end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to "
                             f"provide more KV cache memory. total_num_cumulative_preemption={cum}")
        run = 0 if not busy else (230 if not storm else 180)
        pend = 0 if not busy else (40 if not storm else 600)
        kv = 0.0 if not busy else (72.4 if not storm else 99.1 + random.random() * 0.8)
        gen = 0.0 if not busy else (3900.0 if not storm else 1700.0 + random.random() * 300)
        L.append(f"INFO {t:%m-%d %H:%M:%S} metrics.py:349] Avg prompt throughput: {0 if not busy else 5000.0:.1f} tokens/s, "
                 f"Avg generation throughput: {gen:.1f} tokens/s, Running: {run} reqs, Swapped: 0 reqs, "
                 f"Pending: {pend} reqs, GPU KV cache usage: {kv:.1f}%, CPU KV cache usage: 0.0%.")
        L.append(f"INFO:     10.0.0.{n % 250}:5{n % 1000:03d} - \"POST /v1/completions HTTP/1.1\" 200 OK")
        n += 1
        t += dt.timedelta(seconds=5)
    open("vllm_v0_preemption_storm.log", "w").write("\n".join(L) + "\n")


def v1() -> None:
    E, R = "\x1b[1;36m", "\x1b[0m"
    V = [
        f"(EngineCore_DP0 pid=4121) {E}INFO{R} 06-02 10:00:01 [gpu_model_runner.py:2120] Model loading took 14.99 GiB and 8.123 seconds",
        "(EngineCore_DP0 pid=4121) INFO 06-02 10:00:20 [gpu_worker.py:276] Available KV cache memory: 52.30 GiB",
        "(EngineCore_DP0 pid=4121) INFO 06-02 10:00:20 [kv_cache_utils.py:849] GPU KV cache size: 428,480 tokens",
        "(EngineCore_DP0 pid=4121) INFO 06-02 10:00:20 [kv_cache_utils.py:853] Maximum concurrency for 32,768 tokens per request: 13.08x",
        "(EngineCore_DP0 pid=4121) INFO 06-02 10:00:41 [gpu_model_runner.py:2567] Graph capturing finished in 21 secs, took 3.12 GiB",
    ]
    for i, (run, wait, pre, kv) in enumerate([(12, 0, 0, 31.2), (64, 3, 0, 88.0), (70, 25, 4, 99.6), (66, 40, 9, 100.0),
                                              (60, 31, 6, 99.8), (20, 0, 0, 40.1)]):
        ps = f"Preemptions: {pre}, " if pre else ""
        V.append(f"(APIServer pid=1) INFO 06-02 10:0{1 + i}:00 [loggers.py:123] Engine 000: Avg prompt throughput: 950.2 tokens/s, "
                 f"Avg generation throughput: {2400 - 100 * pre:.1f} tokens/s, Running: {run} reqs, Waiting: {wait} reqs, "
                 f"{ps}GPU KV cache usage: {kv}%, Prefix cache hit rate: 12.5%")
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB "
           "of which 1.06 GiB is free. Process 4121 has 78.12 GiB memory in use. Of the allocated memory 71.40 GiB is "
           "allocated by PyTorch, and 5.82 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is "
           "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation "
           "for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")
    V += [
        "(EngineCore_DP0 pid=4121) ERROR 06-02 10:07:13 [core.py:586] EngineCore encountered a fatal error.",
        "(EngineCore_DP0 pid=4121) ERROR 06-02 10:07:13 [core.py:586] Traceback (most recent call last):",
        f"(EngineCore_DP0 pid=4121) ERROR 06-02 10:07:13 [core.py:586] {oom}",
        oom,  # the same exception printed again without a header: one OOM, not two
    ]
    open("vllm_v1_oom.log", "w").write("\n".join(V) + "\n")


def sglang() -> None:
    S = []
    for i in range(6):
        S.append(f"[2026-03-04 08:15:{10 + i:02d} TP0] Decode batch, #running-req: {50 + i}, #token: {60000 + 900 * i}, "
                 f"token usage: {0.93 + 0.014 * i:.2f}, cuda graph: True, gen throughput (token/s): {2100 - 40 * i:.2f}, "
                 f"#queue-req: {4 + i}")
        if i >= 3:
            S.append(f"[2026-03-04 08:15:{10 + i:02d} TP0] KV cache pool is full. Retract requests. #retracted_reqs: {i - 2}, "
                     f"#new_tokens_gained: {300 * i}, #new_token_ratio: 0.{i}100 -> 0.{i}500")
    S.append("[2026-03-04 08:15:20] Prefill batch. #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.99, "
             "#running-req: 55, #queue-req: 9")
    open("sglang_retractions.log", "w").write("\n".join(S) + "\n")


if __name__ == "__main__":
    v0()
    v1()
    sglang()
