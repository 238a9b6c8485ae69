from .expert_mlps import ExpertMLPs
from .loss_function import load_balancing_loss_func
from .model import MoE
from .model_utils import ACT2FN
from .routing import RouterSinkhorn, RouterTopK
