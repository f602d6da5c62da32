"""Shared code of the transformers integration tests: a random-weight
Llama-architecture model (GQA, RoPE) saved to a directory, a radixkvd child
process (tests/python/rkv_testutil.py), and a worker run as a separate
process.

Worker (python _hf_util.py --model DIR --endpoint SOCK --prompts IN.pt
--out OUT.pt [--new_tokens N] [--page_size P] [--device D]): the model on
torch device D (default cpu); for each prompt in IN.pt
(a list of 1-D int64 tensors) it records, in OUT.pt, with
radixkv.integrations.transformers.PrefixCache:
  cached, saved        PrefixCache.prefill's cached_tokens and saved_blocks
  logits               its next-token logits (float32, shape (vocab,))
  ref_logits           the model's own full prefill without radixkv
  gen, gen_cached      PrefixCache.generate's greedy tokens, its cached_tokens
  ref_gen              model.generate's greedy tokens without radixkv
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_PYTHON = os.path.join(HERE, "..", "python")
if TESTS_PYTHON not in sys.path:
    sys.path.insert(0, TESTS_PYTHON)

# Llama architecture: 8 query heads over 2 KV heads (GQA), RoPE, head_dim 16.
# page_bytes at page_size 16 in fp32: 4 * 2 * 2 * 16 * 16 * 4 = 8 KiB.
TINY = dict(vocab_size=1000, hidden_size=128, intermediate_size=256,
            num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
            max_position_embeddings=1024, rope_theta=10000.0)


def build_model(path: str, seed: int = 0, **overrides) -> str:
    """Saves a random-weight LlamaForCausalLM (fp32, TINY with `overrides`,
    weights from torch.manual_seed(seed)) to `path`; returns path."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, **overrides})
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(path)
    return path


def load_model(path: str, dtype=torch.float32):
    from transformers import LlamaForCausalLM
    return LlamaForCausalLM.from_pretrained(path, dtype=dtype).eval()


@torch.inference_mode()
def full_prefill_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """The next-token logits of a plain forward over the whole prompt."""
    return model(input_ids=ids.view(1, -1)).logits[0, -1].float()


def greedy(model, ids: torch.Tensor, new_tokens: int, **kwargs) -> torch.Tensor:
    out = model.generate(ids.view(1, -1), max_new_tokens=new_tokens, do_sample=False,
                         pad_token_id=0, **kwargs)
    return out[0, ids.numel():]


def run_prompts(model, prefix_cache, prompts, new_tokens: int):
    """The records of the module docstring, one dict per prompt."""
    records = []
    for ids in prompts:
        res = prefix_cache.prefill(ids.view(1, -1))
        gen = prefix_cache.generate(ids.view(1, -1), max_new_tokens=new_tokens,
                                    do_sample=False, pad_token_id=0)[0, ids.numel():]
        records.append(dict(
            cached=res.cached_tokens, saved=res.saved_blocks,
            logits=res.logits[0].float().clone(),
            ref_logits=full_prefill_logits(model, ids),
            gen=gen.clone(), gen_cached=prefix_cache.last.cached_tokens,
            ref_gen=greedy(model, ids, new_tokens)))
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--new_tokens", type=int, default=8)
    parser.add_argument("--page_size", type=int, default=16)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    from radixkv.integrations.transformers import PrefixCache
    torch.set_num_threads(1)
    model = load_model(args.model).to(args.device)
    prompts = [p.to(args.device) for p in torch.load(args.prompts)]
    with PrefixCache(model, endpoint=args.endpoint, page_size=args.page_size,
                     client_name=f"hf-test-{os.getpid()}") as pc:
        records = run_prompts(model, pc, prompts, args.new_tokens)
    records = [{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in r.items()}
               for r in records]
    torch.save(records, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
