"""Test helpers shared by ltm's Python tests (run with Debian's /usr/bin/python3).

Modules are imported explicitly (this package imports nothing itself, so that helpers which
do not need torch stay quick to load):

  ltm_testing.checkpoint   random HF GPT-2 checkpoints (config.json + safetensors, sharded or not,
                           F32/F16/BF16) written by hand, and a reader giving back the exact
                           float32 values stored: make_checkpoint(), load_checkpoint(),
                           load_config().
"""
