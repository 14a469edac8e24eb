"""UNet3D: the MLCommons 3D U-Net segmentation training (KiTS19-shaped data).

Modules: ``files`` (dataset listing and quick checks, numpy only), ``options`` (settings),
``dataset`` (the torch Dataset), ``model`` (the network and loss), ``train`` (the training loop
of the ``original``, ``instrumented`` and ``sleep`` variants). Importing this package does not
import torch, so the host can check a dataset without it.
"""
