"""gated-qwen: gated attention (arXiv 2505.06708) as a first-class Hugging Face Transformers model.

Importing the package registers ``qwen3_gated`` with transformers' Auto classes.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from .configuration_qwen3_gated import Qwen3GatedConfig
from .modeling_qwen3_gated import (
    Qwen3GatedForCausalLM,
    Qwen3GatedForSequenceClassification,
    Qwen3GatedModel,
    Qwen3GatedPreTrainedModel,
)
from .conversion import convert_checkpoint, convert_qwen3_to_gated

__version__ = "0.1.0"

AutoConfig.register(Qwen3GatedConfig.model_type, Qwen3GatedConfig, exist_ok=True)
AutoModel.register(Qwen3GatedConfig, Qwen3GatedModel, exist_ok=True)
AutoModelForCausalLM.register(Qwen3GatedConfig, Qwen3GatedForCausalLM, exist_ok=True)
AutoModelForSequenceClassification.register(Qwen3GatedConfig, Qwen3GatedForSequenceClassification, exist_ok=True)

__all__ = [
    "Qwen3GatedConfig",
    "Qwen3GatedForCausalLM",
    "Qwen3GatedForSequenceClassification",
    "Qwen3GatedModel",
    "Qwen3GatedPreTrainedModel",
    "__version__",
    "convert_checkpoint",
    "convert_qwen3_to_gated",
]
