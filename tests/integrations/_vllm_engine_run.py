"""One vLLM engine process (the LLM class) on the CPU, for test_vllm_engine.

  python _vllm_engine_run.py --model DIR --prompt_ids 1,2,3 [--endpoint SOCK]

Generates greedily from the prompt's token ids with vLLM's own engine; with
--endpoint, with radixkv.integrations.vllm.RadixKVConnector loaded through
--kv-transfer-config's fields (kv_connector, kv_connector_module_path).
vLLM's own prefix cache is off, so every cached token came through the
connector. Prints one JSON line: the generated token ids, vLLM's
num_cached_tokens for the request, the first generated token's top-5
logprobs, and vLLM's prefix-cache counters.
"""
import argparse
import json
import os


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--prompt_ids", required=True)
    parser.add_argument("--endpoint", default="")
    parser.add_argument("--block_size", type=int, default=32)
    parser.add_argument("--max_tokens", type=int, default=8)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {}
    if args.endpoint:
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="RadixKVConnector",
            kv_connector_module_path="radixkv.integrations.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"endpoint": args.endpoint})
    llm = LLM(model=args.model, skip_tokenizer_init=True, dtype="float32",
              max_model_len=1024, block_size=args.block_size, enforce_eager=True,
              enable_prefix_caching=False, disable_log_stats=False, **kw)
    ids = [int(t) for t in args.prompt_ids.split(",")]
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)],
                       SamplingParams(max_tokens=args.max_tokens, temperature=0.0,
                                      logprobs=5, detokenize=False))[0]
    counters = {}
    try:
        for m in llm.get_metrics():
            if "prefix_cache" in m.name or "external" in m.name or "cached" in m.name:
                counters[m.name] = getattr(m, "value", None)
    except Exception as e:  # metrics are informative only
        counters["error"] = repr(e)
    print("RESULT " + json.dumps({
        "tokens": list(out.outputs[0].token_ids),
        "num_cached_tokens": out.num_cached_tokens,
        # The first generated token's top-5 logprobs: computed from the
        # prompt's K/V, loaded or not.
        "first_logprobs": {str(t): lp.logprob
                           for t, lp in (out.outputs[0].logprobs or [{}])[0].items()},
        "counters": counters}), flush=True)


if __name__ == "__main__":
    main()
