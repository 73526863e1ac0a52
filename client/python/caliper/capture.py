"""caliper-capture: calibrate a model in one command (the Caliper counterpart of llm-compressor's
oneshot). Loads an HF model directory, attaches the capture hooks, runs one forward pass per
calibration sample (batch size 1), streams K/V, Linear inputs and weights to caliper-server,
finalizes, and writes the files `caliper calibrate` writes. Exit codes: 0 written, 1 the server
refused (message printed), 2 usage or input error.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import socket
import sys
from typing import List, Optional

EXIT_OK, EXIT_SERVER, EXIT_USAGE = 0, 1, 2
PROG = "caliper-capture"


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, as the CLI's usage errors
        print(f"{PROG}: {message} (see {PROG} --help)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _choice(name: str, choices, aliases=None):
    aliases = aliases or {}

    def parse(value: str) -> str:
        value = aliases.get(value, value)
        if value not in choices:
            expected = (f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1
                        else choices[0])
            raise argparse.ArgumentTypeError(f"expected {expected}, got \"{value}\"")
        return value
    parse.__name__ = name
    return parse


# vLLM's KV cache for a capture: an explicit size, never a share of the machine (on the CPU
# build a share is reduced by the process's own RSS and fails where the share is below it).
DEFAULT_KV_CACHE_BYTES = 512 << 20


def engine_kv_cache_bytes(requested: int, on_cuda: bool) -> int:
    """The KV cache size to give vllm.LLM: `requested`, or on the CPU build
    $VLLM_CPU_KVCACHE_SPACE GiB when that is set (vLLM's own setting for it)."""
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "").strip()
    if not on_cuda and space:
        try:
            gib = float(space)
        except ValueError:
            raise SystemExit(f"VLLM_CPU_KVCACHE_SPACE: expected GiB, got {space!r}") from None
        if gib > 0:
            return int(gib * (1 << 30))
    if requested <= 0:
        raise SystemExit(f"--kv-cache-memory-bytes: must be positive, got {requested}")
    return requested


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="Exit codes: 0 written, 1 the server refused (message printed), "
                       "2 usage or input error.")
    p.add_argument("--server", required=True, metavar="ADDR",
                   help="caliper-server address, e.g. localhost:50051")
    p.add_argument("--model", required=True, metavar="HF_DIR",
                   help="Hugging Face model directory (config.json, weights, tokenizer)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--token-ids", metavar="FILE.json",
                     help="JSON list of token-id lists, one calibration sample each")
    src.add_argument("--text", metavar="FILE",
                     help="text to tokenize with the model's tokenizer (with --samples, --seq-len)")
    p.add_argument("--samples", type=int, metavar="N", help="samples cut from --text")
    p.add_argument("--seq-len", type=int, metavar="L", help="tokens per sample from --text")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created)")
    p.add_argument("--kv", default="per-head", metavar="MODE",
                   type=_choice("kv", ["per-head", "per-tensor", "off"],
                                {"per_head": "per-head", "per_tensor": "per-tensor"}),
                   help="FP8 KV-cache scales per head, per tensor, or none (default per-head)")
    p.add_argument("--fp8", default="e4m3fn", metavar="FLAVOR",
                   type=_choice("fp8", ["e4m3fn", "e4m3fnuz"]),
                   help="FP8 KV format: e4m3fn (qmax 448) or e4m3fnuz (qmax 240)")
    p.add_argument("--attention", default="off", metavar="MODE",
                   type=_choice("attention", ["off", "q"]),
                   help="q: also the query's FP8 scale, per KV head (needs --kv on; default off)")
    p.add_argument("--nvfp4", action="store_true",
                   help="also compute NVFP4 global scales (Linear inputs and weights)")
    p.add_argument("--observer", default="static_minmax", metavar="NAME",
                   type=_choice("observer", ["static_minmax", "minmax"]),
                   help="NVFP4 activation observer (llm-compressor's names)")
    p.add_argument("--kv-observer", default="static_minmax", metavar="NAME",
                   help="FP8 KV observer: static_minmax, minmax, percentile:P or mse "
                        "(llm-compressor's names)")
    p.add_argument("--compat", metavar="NAME",
                   type=_choice("compat", ["llm-compressor"]),
                   help="llm-compressor: its arithmetic for every scale, in the model's dtype "
                        "(absent: Caliper's correctly rounded float32)")
    p.add_argument("--warmup", type=int, default=0, metavar="N",
                   help="skip forward passes (batches) below N")
    p.add_argument("--tp", "--deploy-tp", dest="tp", type=int, metavar="T",
                   help="deployment TP size to write files for (default 1)")
    p.add_argument("--convention", default="compressed-tensors", metavar="NAME",
                   type=_choice("convention", ["compressed-tensors", "modelopt"],
                                {"compressed_tensors": "compressed-tensors"}),
                   help="NVFP4 global-scale form: compressed-tensors (divisor) or modelopt")
    p.add_argument("--format", action="append", default=[], metavar="NAME",
                   help="also write engine files: compressed-tensors, modelopt, vllm-legacy "
                        "(repeatable)")
    p.add_argument("--name", metavar="TEXT", help="session label shown by `caliper sessions`")
    p.add_argument("--mode", default="statistics", metavar="MODE",
                   type=_choice("mode", ["statistics", "raw"]),
                   help="statistics (reduce on the producer, default) or raw (send tensors)")
    p.add_argument("--session", metavar="ID",
                   help="add to this existing session (re-running the same capture after a "
                        "crash resumes it: producer ids are stable, re-sent samples are ignored)")
    p.add_argument("--first-batch", type=int, default=0, metavar="N",
                   help="batch id of the first sample (default 0; give fresh ids when adding "
                        "other samples to a session that uses the minmax observer)")
    p.add_argument("--engine", default="transformers", metavar="NAME",
                   type=_choice("engine", ["transformers", "vllm"]),
                   help="run the model with transformers (default) or vLLM (eager)")
    p.add_argument("--moe-experts", default="routed", metavar="WHICH",
                   type=_choice("moe-experts", ["routed", "all"]),
                   help="MoE expert inputs: routed (the tokens the router sends each expert, "
                        "default) or all (every expert sees every token, as llm-compressor "
                        "calibrates; the model's output stays routed)")
    p.add_argument("--model-device", default="auto", metavar="DEV",
                   type=_choice("model-device", ["cpu", "cuda", "auto"]),
                   help="where the model runs: cpu, cuda, or auto (transformers' device map: "
                        "GPUs, then CPU offload, when CUDA is present; else cpu)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=DEFAULT_KV_CACHE_BYTES,
                   metavar="N",
                   help="--engine vllm: bytes of the engine's KV cache (default 512 MiB: one "
                        "prompt at a time needs little; raise it for long samples of a large "
                        "model). On the CPU build $VLLM_CPU_KVCACHE_SPACE (GiB), when set, wins")
    p.add_argument("--chunk-bytes", type=int, default=4 << 20, metavar="N",
                   help="largest chunk payload in bytes in raw mode")
    p.add_argument("--merge-batches", type=int, default=16, metavar="N",
                   help="statistics mode: merge the statistics of N forward passes on the "
                        "producer before sending (where the observer allows; 0: one per "
                        "tensor and pass); keep it when re-running into a session")
    p.add_argument("--allow-rejected", action="store_true",
                   help="finalize and write even if the server rejected chunks")
    p.add_argument("--token", metavar="TOKEN",
                   help="bearer token of your tenant (absent: $CALIPER_TOKEN)")
    p.add_argument("--token-file", "--token_file", dest="token_file", metavar="FILE",
                   help="read the bearer token from FILE")
    p.add_argument("--tls-ca", "--tls_ca", dest="tls_ca", metavar="PEM",
                   help="connect with TLS, trusting this CA certificate file")
    p.add_argument("--tls-cert", "--tls_cert", dest="tls_cert", metavar="PEM",
                   help="client certificate for mutual TLS (with --tls-key and --tls-ca)")
    p.add_argument("--tls-key", "--tls_key", dest="tls_key", metavar="PEM",
                   help="private key of --tls-cert")
    p.add_argument("--attempts", type=int, default=8, metavar="N",
                   help="tries per call while the server is unreachable (backoff 0.2s..5s)")
    return p


def load_samples(args) -> List[List[int]]:
    if args.token_ids:
        if args.samples is not None or args.seq_len is not None:
            raise UsageError("--samples and --seq-len go with --text, not --token-ids")
        try:
            data = json.loads(pathlib.Path(args.token_ids).read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"--token-ids: {args.token_ids}: {e}") from None
        if (not isinstance(data, list) or not data or not all(
                isinstance(s, list) and s and all(isinstance(t, int) and t >= 0 for t in s)
                for s in data)):
            raise UsageError(f"--token-ids: {args.token_ids}: expected a non-empty JSON list of "
                             "non-empty lists of token ids")
        return data
    if not args.samples or not args.seq_len or args.samples < 1 or args.seq_len < 1:
        raise UsageError("--text needs --samples N and --seq-len L (both >= 1)")
    try:
        text = pathlib.Path(args.text).read_text()
    except OSError as e:
        raise UsageError(f"--text: {args.text}: {e.strerror}") from None
    from transformers import AutoTokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    except Exception as e:  # noqa: BLE001 - any loader failure is an input error here
        raise UsageError(f"--text: no tokenizer in {args.model}: {e}") from None
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    need = args.samples * args.seq_len
    if len(ids) < need:
        raise UsageError(f"--text: {args.text} has {len(ids)} tokens, {need} needed for "
                         f"{args.samples} samples of {args.seq_len}")
    return [ids[i * args.seq_len:(i + 1) * args.seq_len] for i in range(args.samples)]


def producer_prefix(config_text: str, samples, args) -> str:
    """Stable for the same model, samples and mode: a re-run resumes instead of adding again."""
    h = hashlib.sha256()
    h.update(config_text.encode())
    h.update(json.dumps(samples).encode())
    h.update(f"{args.mode}/{args.first_batch}/{args.merge_batches}/{args.moe_experts}/"
             f"{args.engine}".encode())
    return f"{socket.gethostname() or 'localhost'}/caliper-capture/{h.hexdigest()[:16]}"


def _device(choice: str):
    import torch
    if choice == "auto":
        return "auto" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise UsageError("--model-device cuda: no CUDA device is available")
    return choice


def run(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    import grpc

    import caliper

    try:
        if args.token and args.token_file:
            raise UsageError("--token and --token-file: give one of them")
        if args.engine == "vllm":
            import importlib.util
            if importlib.util.find_spec("vllm") is None:
                raise UsageError("--engine vllm: vLLM is not installed in this Python")
            if args.model_device != "auto":
                raise UsageError("--engine vllm places the model itself: leave --model-device "
                                 "auto")
            if args.moe_experts != "routed":
                raise UsageError("--moe-experts all: only with --engine transformers")
        config_path = pathlib.Path(args.model) / "config.json"
        try:
            config_text = config_path.read_text()
            config = json.loads(config_text)
        except (OSError, ValueError) as e:
            raise UsageError(f"--model: {config_path}: {e}") from None
        if args.kv == "off" and not args.nvfp4:
            raise UsageError("nothing to calibrate: --kv off without --nvfp4")
        for flag, value, low in (("--warmup", args.warmup, 0),
                                 ("--first-batch", args.first_batch, 0),
                                 ("--attempts", args.attempts, 1),
                                 ("--merge-batches", args.merge_batches, 0)):
            if value < low:
                raise UsageError(f"{flag}: must be >= {low}, got {value}")
        if args.tp is not None and args.tp < 1:
            raise UsageError(f"--tp: must be >= 1, got {args.tp}")
        samples = load_samples(args)
        token = args.token
        if args.token_file:
            try:
                token = pathlib.Path(args.token_file).read_text().strip()
            except OSError as e:
                raise UsageError(f"--token-file: {args.token_file}: {e.strerror}") from None
            if not token:
                raise UsageError(f"--token-file: {args.token_file} is empty")
        recipe = caliper.Recipe(kv=args.kv.replace("-", "_"), fp8=args.fp8,
                                nvfp4_weights=args.nvfp4, nvfp4_activations=args.nvfp4,
                                observer=args.observer, warmup=args.warmup,
                                kv_observer=args.kv_observer, compat=args.compat or "",
                                attention=args.attention)
        try:
            recipe.to_proto()
        except ValueError as e:
            raise UsageError(str(e).replace("recipe.kv_observer", "--kv-observer")
                             .replace("recipe.attention", "--attention")) from None
        try:
            client = caliper.Client(args.server, token=token, tls_ca=args.tls_ca,
                                    tls_cert=args.tls_cert, tls_key=args.tls_key,
                                    attempts=args.attempts, who=PROG)
        except ValueError as e:
            raise UsageError(str(e)) from None
        device = _device(args.model_device) if args.engine == "transformers" else "auto"
    except UsageError as e:
        print(f"{PROG}: {e} (see {PROG} --help)", file=sys.stderr)
        return EXIT_USAGE

    options = dict(mode=args.mode, producer_prefix=producer_prefix(config_text, samples, args),
                   chunk_bytes=args.chunk_bytes, merge_batches=args.merge_batches)
    try:
        if args.session:
            session = client.session(args.session, **options)
        else:
            name = args.name or f"capture {config.get('architectures', ['?'])[0]} " \
                                f"({pathlib.Path(args.model).resolve().name})"
            session = client.create_session(config, recipe, name=name, **options)
    except grpc.RpcError as e:
        return _server_error("CreateSession" if not args.session else "GetSession", e)
    print(f"session   {session.id}", flush=True)

    if args.engine == "vllm":
        run_vllm(args, session, samples)
    else:
        run_transformers(args, session, samples, device)
    try:
        session.flush()
    except caliper.RejectedChunksError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        if not args.allow_rejected:
            print(f"{PROG}: session {session.id} left open and nothing written; fix the input "
                  "and capture again, or pass --allow-rejected to finalize with what was "
                  "accepted", file=sys.stderr)
            return EXIT_SERVER
    except caliper.StreamError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return EXIT_SERVER
    print(f"streamed  {len(samples)} samples: {session.wire_bytes} bytes on the wire for "
          f"{session.tensor_bytes} tensor bytes ({args.mode} mode)", flush=True)
    try:
        session.finalize()
        result = session.scales(tp=args.tp or 1, formats=args.format,
                                convention=args.convention, out=args.out)
    except grpc.RpcError as e:
        return _server_error("Finalize/GetScales", e)
    finally:
        session.close()
    w = result.written
    assert w is not None  # out= was given
    for path in ([w.kv_cache_calib] if w.kv_cache_calib else []) + [w.scales_json] + \
            w.engine_files:
        print(f"wrote     {path}")
    print(f"warnings  {len(result.warnings)}")
    return EXIT_OK


def _progress(total: int):
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=PROG, unit="sample", file=sys.stderr)


def run_transformers(args, session, samples, device) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from caliper import hooks
    load = dict(dtype="auto", attn_implementation="eager")
    if device == "auto":
        load["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(args.model, **load)
    if device != "auto":
        model = model.to(device)
    model.eval()
    first = next(model.parameters()).device
    handle = hooks.attach(model, session, first_batch=args.first_batch,
                          moe_experts=args.moe_experts)
    progress = _progress(len(samples))
    try:
        with torch.no_grad():
            for ids in samples:
                model(torch.tensor([ids], device=first), use_cache=False)
                if progress is not None:
                    progress.update(1)
                    progress.set_postfix_str(f"queued {session_queued(session) >> 10} KiB")
    finally:
        if progress is not None:
            progress.close()
        handle.detach()


def run_vllm(args, session, samples) -> None:
    """One engine step per sample (max_tokens=1: a prefill of that prompt), eager, in-process
    (the hooks and the session share the process; see caliper.vllm_hooks)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import torch
    import vllm

    from caliper import vllm_hooks
    llm = vllm.LLM(model=args.model, skip_tokenizer_init=True, enforce_eager=True, dtype="auto",
                   max_model_len=max(len(s) for s in samples) + 1,
                   kv_cache_memory_bytes=engine_kv_cache_bytes(args.kv_cache_memory_bytes,
                                                                torch.cuda.is_available()))
    handle = vllm_hooks.attach(llm, session, first_batch=args.first_batch,
                               weights_from=args.model)
    params = vllm.SamplingParams(max_tokens=1)
    progress = _progress(len(samples))
    try:
        for ids in samples:
            llm.generate([{"prompt_token_ids": ids}], params, use_tqdm=False)
            if progress is not None:
                progress.update(1)
    finally:
        if progress is not None:
            progress.close()
        handle.detach()


def session_queued(session) -> int:
    return sum(p.queued_bytes for p in session._producers.values())


def _server_error(what: str, e) -> int:
    print(f"{PROG}: {what} failed: {e.code().name}: {e.details()}", file=sys.stderr)
    return EXIT_SERVER


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
