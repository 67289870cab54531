"""Images decoded a chunk at a time with nvImageCodec: the GPU's JPEG engines, or its CPU codecs.

On a GPU host the cores are the limit of a vision loader: 16 of them decode and crop
6-14k ImageNet-size JPEGs a second, where the hardware JPEG decoders of one H200 decode
27-33k. ``NvImageCodec`` hands a chunk of encoded images to nvImageCodec at once, each
decoded only in its crop's region (``CodeStream.get_sub_code_stream(region=)``), and
gives back each region's pixels on the host, ``uint8`` ``[h, w, 3]`` RGB, as torchvision's
loader decodes them (no EXIF rotation). ``"gpu"`` decodes on the GPU (nvJPEG: ``pip
install 'meshfeed[gpu-decode]'``), ``"cpu"`` with nvImageCodec's CPU codecs, which need
no GPU and no driver (libjpeg-turbo and OpenCV's PNG and WebP: the pixels Pillow
decodes). Each thread keeps a decoder of its own (decoders are not shared across
threads), made at its first chunk, so the object itself pickles to worker processes.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

Backend = Literal["gpu", "cpu"]
"""Where nvImageCodec decodes: the GPU's decoders, or its CPU codecs."""


_IMPORT = threading.Lock()
_NOISE = ("Failed to load nvjpeg", "Failed to load nvtiff", "Note: If using nvImageCodec's")
"""The lines nvImageCodec prints at import for each GPU codec library it does not find
(the CPU codecs need none of them), which are left out of stderr."""


def nvimgcodec() -> Any:
    """The ``nvidia.nvimgcodec`` module, or an error naming the extra that installs it.
    Imported once per process, its lines about missing GPU codec libraries held back."""
    with _IMPORT:
        module = sys.modules.get("nvidia.nvimgcodec")
        if module is not None:
            return module
        os.environ.setdefault("PYNVIMGCODEC_VERBOSITY", "0")
        sys.stderr.flush()
        saved = os.dup(2)
        with tempfile.TemporaryFile() as said:
            os.dup2(said.fileno(), 2)  # its C++ side writes to the descriptor itself
            try:
                from nvidia import nvimgcodec as nv
            except ImportError:
                nv = None
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            said.seek(0)
            lines = said.read().decode(errors="replace").splitlines()
        kept = [line for line in lines if line and not line.startswith(_NOISE)]
        if kept:
            sys.stderr.write("\n".join(kept) + "\n")
    if nv is None:
        raise ImportError(
            "decoding with nvImageCodec needs it: pip install 'meshfeed[gpu-decode]' "
            "(nvidia-nvimgcodec-cu13 and nvidia-nvjpeg; from a clone: pip install -e "
            "'.[gpu-decode]')."
        )
    return nv


def installed() -> bool:
    """Whether nvImageCodec can be imported here."""
    try:
        nvimgcodec()
    except ImportError:
        return False
    return True


class NvImageCodec:
    """Crops of encoded images, decoded a chunk at a time (the module docstring)."""

    def __init__(self, backend: Backend, device: int = 0) -> None:
        self.backend = backend
        self.device = device
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"backend": self.backend, "device": self.device}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["backend"], state["device"])

    def _decoder(self) -> tuple[Any, Any]:
        found = getattr(self._local, "decoder", None)
        if found is None:
            nv = nvimgcodec()
            if self.backend == "cpu":
                decoder = nv.Decoder(
                    device_id=nv.NVIMGCODEC_DEVICE_CPU_ONLY,
                    backends=[nv.Backend(nv.BackendKind.CPU_ONLY)],
                )
            else:
                decoder = nv.Decoder(device_id=self.device)
            params = nv.DecodeParams(apply_exif_orientation=False, color_spec=nv.ColorSpec.SRGB)
            found = self._local.decoder = (decoder, params)
        return found

    def regions(
        self, images: Sequence[Any], boxes: Sequence[tuple[int, int, int, int]]
    ) -> list[np.ndarray]:
        """Each image's ``(top, left, height, width)`` box, decoded, on the host."""
        nv = nvimgcodec()
        decoder, params = self._decoder()
        streams = []
        for data, (top, left, h, w) in zip(images, boxes, strict=True):
            stream = nv.CodeStream(np.frombuffer(data, np.uint8))
            streams.append(
                stream.get_sub_code_stream(region=nv.Region(top, left, top + h, left + w))
            )
        decoded = decoder.decode(streams, params=params) if streams else []
        out = []
        for k, image in enumerate(decoded):
            if image is None:  # the record stage runs the records alone to name the one
                which = f"image {k} of the chunk" if len(streams) > 1 else "the image"
                raise ValueError(
                    f"nvImageCodec ({self.backend}) could not decode {which} in its region "
                    f"{list(boxes[k])} (top, left, height, width)."
                )
            out.append(np.asarray(image.cpu()))
        return out
