"""Image classification (ResNet-18/50, AlexNet) on ImageNet-layout JPEG folders or grouped files."""
