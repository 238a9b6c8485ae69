"""The traceable all-reduce: the identity outside a process group, a new tensor, and recorded by
torch.jit.trace so a saved rank graph still calls it when loaded again."""

import io

import torch

from neuron_port.parallel.collectives import process_group_reduce


class _Row(torch.nn.Module):
    def forward(self, x):
        return process_group_reduce(x * 2)


def test_outside_a_process_group_it_is_a_new_tensor_of_the_same_values():
    x = torch.arange(6.0).reshape(2, 3)
    y = process_group_reduce(x)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()


def test_a_traced_graph_keeps_the_all_reduce_through_save_and_load():
    x = torch.randn(2, 3)
    traced = torch.jit.trace(_Row(), x)
    assert "neuron_port::all_reduce_sum" in str(traced.graph)
    buffer = io.BytesIO()
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    assert "neuron_port::all_reduce_sum" in str(loaded.graph) and torch.equal(loaded(x), x * 2)
