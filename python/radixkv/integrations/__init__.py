"""Adapters that plug radixkv into inference engines.

Each module imports its engine lazily and only when it is used:

  radixkv.integrations.vllm          vLLM's KV connector (KVConnectorBase_V1)
  radixkv.integrations.sglang        SGLang's HiCache storage backend
  radixkv.integrations.transformers  Hugging Face transformers models

Importing this package needs none of the engines.
"""
