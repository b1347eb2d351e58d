"""The suite runs on the CPU on any machine (conftest.py): only the GPU's own tests see a GPU."""
import os
import subprocess
import sys

import pytest
import torch


def test_a_test_and_the_processes_it_starts_see_no_gpu():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and torch.cuda.is_available() is False
    seen = subprocess.run([sys.executable, "-c", "import os; print(repr(os.environ['CUDA_VISIBLE_DEVICES']))"],
                          stdout=subprocess.PIPE, text=True, check=True).stdout
    assert seen == "''\n"


@pytest.mark.gpu  # as requires_cuda marks a test, without its skip: this one needs no GPU
def test_a_gpu_test_and_its_processes_see_the_machines_gpus(visible_gpus):
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == visible_gpus
    seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"],
                          stdout=subprocess.PIPE, text=True, check=True).stdout
    assert seen == f"{visible_gpus}\n"
