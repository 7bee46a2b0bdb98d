"""Make a tiny Llama model directory that real vLLM can serve on a CPU, without any download.

Used by ``scripts/vllm-lab build`` (run with the vLLM venv's Python, which has torch,
transformers and tokenizers) for the real serving test. The model is 2 layers, hidden size
256 and 4 attention heads: a head size of 64, because vLLM's CPU attention refuses smaller
ones ("Unsupported CPU attention configuration"). Its weights are random (seeded) and its
tokenizer a byte-level BPE trained here on a few sentences, with a chat template so that
``/v1/chat/completions`` works too. What it says is noise; that it answers is the point.

Usage: python tiny-llama.py OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "Slurm schedules jobs on the nodes of a cluster.",
    "A training job writes checkpoints to a shared file system.",
    "The server answers completions over HTTP.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789 .,;:!?'\"-",
]


def main(out: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    os.makedirs(out, exist_ok=True)
    bos, eos, unk = "<s>", "</s>", "<unk>"
    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=[bos, eos, unk],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=unk
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "slurmfm-tiny.json"), "w") as f:
        json.dump({"made_by": "scripts/tiny-llama.py", "head_size": 256 // 4}, f)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
