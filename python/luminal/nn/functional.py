"""luminal.nn.functional: torch.nn.functional's names over luminal tensors (`import luminal.nn.functional as F`).

Each function lives with its family (convolution.py, attention.py, normalization.py, losses.py, indexing.py, and
the element-wise ones as Tensor methods); this module only gathers them under torch's names.
"""
from ..functional import *  # noqa: F401,F403
from ..functional import embedding, layer_norm, linear, log_softmax, pad, rms_norm, softmax  # noqa: F401
from ..convolution import *  # noqa: F401,F403
from ..attention import *  # noqa: F401,F403
from ..normalization import *  # noqa: F401,F403
from ..losses import *  # noqa: F401,F403
from ..indexing import *  # noqa: F401,F403
