"""Two adapters a new user could write: each matches Hugging Face's greedy tokens or fails
silently, and each must be caught by ``port --check``'s self-checks. The package also declares an
entry point to a name it does not define (``NoSuchAdapter``): a broken plugin must be a warning."""

from neuron_port.families import Gemma3Family, Gemma4Family


class Gemma3WithoutEmbeddingScale(Gemma3Family):
    """Forgets that Gemma-3's embedding module multiplies rows by sqrt(hidden)."""

    def embedding_scales(self, config):
        return None, None


class Gemma4WithoutSoftcap(Gemma4Family):
    """Forgets the final logit softcap (argmax does not see it)."""

    def softcap(self, config):
        return None
