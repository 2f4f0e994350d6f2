"""What the step clock reads as a Paddle root layer's mode."""
import paddle


class TrainingMode:
    """A root forward is a train forward when the root layer is in training mode (layer.train()) and gradients
    are enabled: evaluation under paddle.no_grad() is eval, as under layer.eval(), and follows eval=."""

    def __init__(self, layer):
        self.layer = layer

    @property
    def training(self):
        return self.layer.training and paddle.is_grad_enabled()
