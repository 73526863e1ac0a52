"""What the server reports about sessions, as typed values; the package's version."""
import pathlib

import caliper
from caliper._pb import caliper_pb2 as pb


def test_session_info_from_the_message():
    message = pb.Session(id="abc", name="demo", state=pb.FINALIZED, accepted_chunks=3,
                         accepted_bytes=4096, rejected_chunks=1, skipped_warmup_chunks=2,
                         modules_with_weights=5, modules_with_inputs=6, created_unix_ms=7,
                         model=pb.ModelDescription(architecture="LlamaForCausalLM",
                                                   model_type="llama", num_layers=2,
                                                   num_attention_heads=4, num_kv_heads=2,
                                                   head_dim=8, hidden_size=32, dtype="BF16"),
                         recipe=caliper.Recipe(kv="off", nvfp4_weights=True).to_proto(),
                         layers=[pb.LayerProgress(layer=0, k_tokens=40, v_tokens=40),
                                 pb.LayerProgress(layer=1, k_tokens=40, v_tokens=32)])
    info = caliper.SessionInfo.from_proto(message)
    assert info == caliper.SessionInfo(
        "abc", "demo", "finalized",
        caliper.ModelInfo("LlamaForCausalLM", "llama", 2, 4, 2, 8, 32, "BF16"),
        caliper.Recipe(kv="off", nvfp4_weights=True), 3, 4096, 1, 2, 5, 6, 7,
        (caliper.LayerProgress(0, 40, 40), caliper.LayerProgress(1, 40, 32)))
    assert caliper.SessionInfo.from_proto(pb.Session(id="x")).state == "open"


def test_version_is_the_repositorys():
    version_file = pathlib.Path(__file__).resolve().parents[3] / "VERSION"
    if version_file.is_file():  # in the repository; an sdist's tests have no repository around
        assert caliper.__version__ == version_file.read_text().strip()
    assert caliper.__version__[0].isdigit()


def test_the_package_is_typed():
    root = pathlib.Path(caliper.__file__).parent
    assert (root / "py.typed").is_file()
    assert (root / "_pb" / "caliper_pb2.pyi").is_file()
