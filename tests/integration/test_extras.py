"""What a missing optional dependency says: which extra to install."""

import subprocess
import sys


def test_the_pytorch_adapter_without_torch_names_the_extra():
    code = ("import sys; sys.modules['torch'] = None\n"  # (as if PyTorch were not installed)
            "try:\n    import dali_shards.pytorch\nexcept ImportError as exc:\n    print(type(exc).__name__, exc.name, exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ImportError torch dali_shards.pytorch needs PyTorch"), out.stdout
    assert "pip install 'dali-shards[torch]'" in out.stdout


def test_the_ray_engine_without_ray_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['ray'] = None\n"  # (as if Ray were not installed)
            "from dali_shards.cli import main\n"
            f"sys.exit(main(['write', {str(tmp_path / 'tree')!r}, {str(tmp_path / 'o' / 's-%03d.tar')!r}]))\n")
    from dali_shards.sample_data import sample_images

    src = tmp_path / "tree"
    (src / "cat").mkdir(parents=True)
    (src / "cat" / "a.jpg").write_bytes(open(sample_images()[0].path, "rb").read())
    code = code.replace("]))", ", '--engine', 'ray']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "dali-shards write: error: engine 'ray' needs Ray, which is not installed" in out.stderr
    assert "pip install 'dali-shards[ray]'" in out.stderr


def _imports(code):
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_the_jax_adapter_without_jax_names_the_extra():
    out = _imports("import sys; sys.modules['jax'] = None\n"
                   "try:\n    import dali_shards.jax\nexcept ImportError as exc:\n    print(type(exc).__name__, exc.name, exc)\n")
    assert out.startswith("ImportError jax dali_shards.jax needs JAX") and "pip install 'dali-shards[jax]'" in out, out


def test_the_package_needs_neither_torch_nor_jax_and_the_jax_adapter_no_torch():
    blocked = "import sys; sys.modules.update(dict.fromkeys(%r))\n"
    assert "ok" in _imports(blocked % (("torch", "jax", "jaxlib"),) + "import dali_shards, dali_shards.session; print('ok')")
    out = _imports(blocked % (("torch",),) + "import dali_shards.jax, dali_shards.jax.checkpoint\n"
                   "from dali_shards.jax import CheckpointSave, DALIShardedIterator; print('ok')")
    assert "ok" in out
