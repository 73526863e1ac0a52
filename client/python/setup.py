"""Builds caliper-client: generates caliper/_pb/caliper_pb2*.py (and caliper_pb2.pyi) from
proto/caliper.proto, and takes the version from the repository's VERSION file.

The stubs are never committed; they are made here, with the grpcio-tools pyproject.toml pins,
whenever the package is built (pip install ./client/python, a wheel, an sdist). The proto and
VERSION are read from the repository (../../) or, in an sdist, from the copies beside this file;
CALIPER_PROTO / CALIPER_VERSION_FILE name them when the package is built from elsewhere.
"""
import os
import pathlib
import re

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent


def _proto_path() -> pathlib.Path:
    for candidate in (os.environ.get("CALIPER_PROTO"), HERE / "proto" / "caliper.proto",
                      HERE.parent.parent / "proto" / "caliper.proto"):
        if candidate and pathlib.Path(candidate).is_file():
            return pathlib.Path(candidate)
    raise SystemExit("caliper-client: proto/caliper.proto not found (set CALIPER_PROTO)")


def _version() -> str:
    for candidate in (os.environ.get("CALIPER_VERSION_FILE"), HERE / "VERSION",
                      HERE.parent.parent / "VERSION"):
        if candidate and pathlib.Path(candidate).is_file():
            return pathlib.Path(candidate).read_text().strip()
    raise SystemExit("caliper-client: VERSION not found (set CALIPER_VERSION_FILE)")


def generate_stubs(out_dir: pathlib.Path) -> None:
    import grpc_tools
    from grpc_tools import protoc  # build requirement

    proto = _proto_path()
    out_dir.mkdir(parents=True, exist_ok=True)
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["grpc_tools.protoc", f"-I{proto.parent}", f"-I{include}", f"--python_out={out_dir}",
            f"--pyi_out={out_dir}", f"--grpc_python_out={out_dir}", str(proto)]
    if protoc.main(args) != 0:
        raise SystemExit(f"caliper-client: protoc failed on {proto}")
    grpc_file = out_dir / "caliper_pb2_grpc.py"
    # protoc writes an absolute import; the stubs live inside caliper._pb.
    text = re.sub(r"^import caliper_pb2 as", "from . import caliper_pb2 as",
                  grpc_file.read_text(), flags=re.M)
    grpc_file.write_text(text)
    (out_dir / "__init__.py").write_text(
        '"""Generated from proto/caliper.proto at build time."""\n')


class BuildPy(build_py):
    def run(self):
        generate_stubs(HERE / "caliper" / "_pb")
        if "caliper._pb" not in self.packages:
            self.packages.append("caliper._pb")  # exists only now
        self.package_data.setdefault("caliper._pb", []).append("*.pyi")
        super().run()


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = pathlib.Path(base_dir) / "proto"
        target.mkdir(exist_ok=True)
        (target / "caliper.proto").write_bytes(_proto_path().read_bytes())
        (pathlib.Path(base_dir) / "VERSION").write_text(_version() + "\n")


setup(version=_version(), cmdclass={"build_py": BuildPy, "sdist": Sdist})
