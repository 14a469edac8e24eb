"""Build step of twintrace/dlio (images/dlio/Dockerfile): DLIO 2.0.0 imports TensorFlow eagerly
in dlio_benchmark/profiler/profiler_factory.py, for its TensorBoard profiler only; without
TensorFlow installed every run would fail there. Move the import into the branch that uses it.
Fails the build if the file is not the one this was written for (a new DLIO version: review)."""

import pathlib

import dlio_benchmark.profiler as profiler

path = pathlib.Path(profiler.__file__).parent / "profiler_factory.py"
text = path.read_bytes().decode()  # CRLF line endings: kept as they are
eager = "from dlio_benchmark.profiler.tf_profiler import TFProfiler"
lazy = "return TFProfiler.get_instance()"
if text.count(eager) != 1 or text.count(lazy) != 1:
    raise SystemExit(f"{path} is not DLIO 2.0.0's: review images/dlio/patch_dlio.py")
newline = "\r\n" if "\r\n" in text else "\n"
indent = text.split(lazy)[0].rsplit("\n", 1)[1]
text = text.replace(eager, "# " + eager + "  (imported where it is used: no TensorFlow here)")
text = text.replace(lazy, eager + newline + indent + lazy)
path.write_bytes(text.encode())
print(f"patched {path}")
