"""The device label the sidebar, the About page and recorded benchmarks show."""

import torch

from core.device import device_label


def test_the_cpu_label_counts_its_threads_in_words():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert device_label(torch.device("cpu")) == "cpu (1 thread)"
        torch.set_num_threads(2)
        assert device_label(torch.device("cpu")) == "cpu (2 threads)"
    finally:
        torch.set_num_threads(threads)
