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
