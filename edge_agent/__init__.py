"""edge-agent: inference runtime and fleet agent for Intel edge boxes."""

import os as _os

__version__ = "0.1.0"

# OpenCV reads its image size limit once, when the library loads, so it is set before
# anything imports cv2. Its default, 2^30 pixels, let a 1 MB PNG that declares 32768 x
# 32768 decode into 3 GB, on a box with 4 or 8. 2^26 (67 MP, 200 MB as BGR) is twice an
# 8K frame; an operator who needs more sets the variable.
MAX_IMAGE_PIXELS = 1 << 26
_os.environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_IMAGE_PIXELS))
