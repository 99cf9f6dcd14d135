"""Network architectures: the diffusion UNet and the smoothed classifiers."""
