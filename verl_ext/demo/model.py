"""Build a tiny *random* model of the Qwen3 architecture, saved with the real Qwen3 tokenizer (no downloads).

It generates noise; it exists so verl's trainer, weight sync and rollout run end to end on CPU with the real
tokenizer and chat template. Usage::

    python -m verl_ext.demo.model --tokenizer build/tokenizers/qwen3 --out build/demo/tiny-qwen3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def build_tiny_qwen3(
    out_dir: str | Path,
    tokenizer_dir: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    seed: int = 0,
) -> Path:
    """Save a randomly initialised Qwen3ForCausalLM (fp32) plus the tokenizer in ``out_dir``; return it.

    The vocabulary is the tokenizer's full size (special tokens included) so every id the template renders is valid;
    embeddings are tied to keep the model small (about 10M parameters, almost all of them the embedding).
    """
    from huggingface_hub import utils as hub_utils
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    out = Path(out_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    im_end, end_of_text = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=end_of_text,
        eos_token_id=im_end,
        pad_token_id=end_of_text,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    # Qwen3's own generation config stops on both <|im_end|> and <|endoftext|>; engines read it for their eos ids.
    model.generation_config = GenerationConfig(
        bos_token_id=end_of_text, eos_token_id=[im_end, end_of_text], pad_token_id=end_of_text
    )
    out.mkdir(parents=True, exist_ok=True)
    # A 40 MB save takes a fraction of a second: its progress bar would only clutter the demo's output.
    # Both switches are put back as they were (transformers' enable_progress_bar also switches the hub's on).
    bars_on, hub_bars_off = hf_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out))
    finally:
        if bars_on:
            hf_logging.enable_progress_bar()
        if hub_bars_off:
            hub_utils.disable_progress_bars()
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> None:
    """Save a tiny random model of the Qwen3 architecture with the real Qwen3 tokenizer to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="folder of the real Qwen3 tokenizer")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = build_tiny_qwen3(args.out, args.tokenizer, seed=args.seed)
    print(f"tiny random Qwen3 model written to {out}")


if __name__ == "__main__":
    main()
