"""How to return weights trainmaster can check, told for the framework that wrote the refused or
opaque files, judged by their names and by what they were found to be: a Hugging Face Trainer's
folder, a Stable-Baselines3 model, a Lightning checkpoint, or plain PyTorch."""

from __future__ import annotations

import re

SAFETENSORS = 'safetensors.torch.save_file(model.state_dict(), "model.safetensors")'

HF = re.compile(r"training_args\.bin|checkpoint-\d+/|pytorch_model[-.\w]*\.bin|rng_state[_\d]*\.pth|"
                r"(optimizer|scheduler)\.pt\b")
SB3 = re.compile(r"Stable-Baselines3|\.zip\b")
LIGHTNING = re.compile(r"\.ckpt\b|lightning_logs/")

HINTS = (
    (HF, "Hugging Face Trainer: it writes model.safetensors itself (save_safetensors=True, the default); leave "
         'its pickled extras out with the spec\'s outputs.exclude: ["training_args.bin", "checkpoint-*/"] '
         "(or save only the final model with trainer.save_model)"),
    (SB3, f"Stable-Baselines3: save the policy's weights, {SAFETENSORS.replace('model.state_dict()', 'model.policy.state_dict()')}, "
          'and leave the model archive out with the spec\'s outputs.exclude (e.g. ["*.zip"])'),
    (LIGHTNING, f"Lightning: save the module's weights, {SAFETENSORS.replace('model.', 'lightning_module.')}, and "
                'leave the checkpoints out with the spec\'s outputs.exclude (e.g. ["*.ckpt", "lightning_logs/"])'),
)
GENERIC = f"save weights as safetensors instead, {SAFETENSORS}, or leave the file out with the spec's outputs.exclude"


def save_hint(found: str) -> str:
    """The hint for the files `found` names and describes (their paths and what they were found to be)."""
    for pattern, hint in HINTS:
        if pattern.search(found):
            return hint
    return GENERIC


def with_hint(reason: str, generic: str) -> str:
    """`reason` with the one-size hint `generic` (the verifier's) replaced by the one for its files."""
    return reason.replace(generic, save_hint(reason.replace(generic, ""))) if generic in reason else reason
