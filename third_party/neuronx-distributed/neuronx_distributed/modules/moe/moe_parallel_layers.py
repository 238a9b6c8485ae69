import math
from typing import Optional, Tuple, Callable, Any, Sequence, List

import torch
import torch.nn as nn
import torch.distributed
from torch.distributed import ProcessGroup
from torch import Tensor

from neuronx_distributed.parallel_layers import layers, mappings, parallel_state, utils
from neuronx_distributed.parallel_layers.parallel_state import (
    get_expert_model_parallel_size,
    get_tensor_model_parallel_group,
    get_expert_model_parallel_group,
)


class ExpertFusedLinearWithAsyncCommunication(torch.autograd.Function):
    """Linear layer execution with asynchronous communication, specialized for
    cases where there are multiple linears that are applied to multiple inputs
    (i.e. Mixture of Experts, where there are multiple inputs, with each assigned
    to a single expert).
    In particular, this function supports parallel execution of linear layers across
    all experts, where matmuls/collectives for all experts are launched in a
    single operation (we call this "Expert Fusion").

    The implementation largely mimics LinearWithAsyncCommunication, but is modified for the 3D weights.

    notation used for shapes:
    e: number of experts
    h: input dim
    i: output dim

    shapes:
    * input/input.grad (e, ..., h)
    * output/output.grad (e, ..., i)
    * weight (e, i, h)

    NOTE: that we have inner dimensions denoted by '...', which can be an arbitrary
    number of dimensions. In general, the product of inner dimensions can be
    thought of as the number of tokens.
    Sometimes with MoE workloads it is convenient to have tokens laid out in multiple
    dimensions to facilitate tracking when they are partitioned using multiple
    parallelism dimensions.
    """

    @staticmethod
    def forward(
        ctx,
        input: Tensor,
        weight: Tensor,
        bias: Optional[Tensor],
        async_grad_allreduce: bool,
        sequence_parallel_enabled: bool,
        sequence_dimension: Optional[int] = 0,
        save_for_backward: bool = True,
        process_group: Optional[ProcessGroup] = None,
        reduce_dtype: torch.dtype = torch.float32,
    ):
        if bias is not None:
            raise NotImplementedError("Bias is not currently supported for MoE")
        if sequence_parallel_enabled:
            raise NotImplementedError(
                "sequence parallelism (SP) is not currently supported for expert "
                "fused linear layers. If SP is in use for the model, then we "
                "currently expect SP to be exited before linear layers are applied."
            )
        # sequence_dimension parameter is unused (defined for compatibility with LinearWithAsyncCommunication)
        if input.shape[0] != weight.shape[0] and input.shape[0] > 1:
            raise RuntimeError(
                f"input and weight disagree on number of experts (first dimension). "
                f"input_shape={tuple(input.shape)}, weight_shape={tuple(weight.shape)}"
            )

        ctx.async_grad_allreduce = async_grad_allreduce
        ctx.compute_weight_gradient = weight.requires_grad
        # TODO: Currently reduced_dtype is not used for upcasting the
        # all-reduce collective in backward, add a change to upcast
        ctx.reduce_dtype = reduce_dtype
        if process_group is None:
            process_group = get_tensor_model_parallel_group()
        ctx.process_group = process_group

        if save_for_backward:
            if ctx.compute_weight_gradient:
                ctx.save_for_backward(input, weight)
            else:
                ctx.save_for_backward(weight)

        # E: num_experts, H: input_size, I: intermediate/output_size
        # ... might refer to 1 or more dimensions, including C dimension (expert capacity)
        # input: (E, ..., H), weight: (E, H, I)
        output = torch.einsum("e...h,ehi->e...i", input, weight)

        # output: (E, ..., I)
        return output

    @staticmethod
    def backward(ctx: Any, *grad_outputs: Sequence[Tensor]) -> Tuple[
        Tensor,
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
        Optional[Tensor],
    ]:
        # grad_output: (E, ..., I)
        # input: (E, ..., H), weight: (E, H, I)
        if ctx.compute_weight_gradient:
            input, weight = ctx.saved_tensors
        else:
            weight = ctx.saved_tensors[0]
            input = None
        grad_output: torch.Tensor = grad_outputs[0]

        # grad_input: (E, ..., H)
        grad_input = torch.einsum("e...i,ehi->e...h", grad_output, weight)

        if ctx.async_grad_allreduce:
            # Asynchronous all-reduce
            torch.distributed.all_reduce(
                grad_input,
                group=ctx.process_group,
            )

        # if no weight gradient, immediately return
        if not ctx.compute_weight_gradient:
            return grad_input, None, None, None, None, None, None, None, None

        # grad_weight: (E, H, I)
        grad_weight = torch.einsum("e...h,e...i->ehi", input, grad_output)

        return grad_input, grad_weight, None, None, None, None, None, None, None


class ExpertFusedLinear(nn.Module):
    def _mark_expert_parallel_weights(self, iterable=None, expert_parallel_group_size=None, is_prefill=True, expert_distribution=None):
        """Register expert parallel parameters"""
        if expert_parallel_group_size is None:
            expert_parallel_group_size = get_expert_model_parallel_size()

        if expert_parallel_group_size > 1:
            if iterable is None:
                iterable = self.parameters()

            for p in iterable:
                p.expert_model_parallel = True
                if is_prefill:
                    p.is_prefill = True
                p.expert_distribution = expert_distribution

    def _apply(self, fn, *args, **kwargs):
        """Moving parameters from cpu to device creates new parameters. to() method
        internally calls the _apply method for all the submodules, which we override
        here to make sure ep parameters are marked on device as well"""

        out = super()._apply(fn, *args, **kwargs)
        self._mark_expert_parallel_weights()
        return out

    def _save_to_state_dict(self, destination, *args, **kwargs):
        if not self.training:
            super()._save_to_state_dict(destination, *args, **kwargs)

        initial_states = {id(v) for v in destination.values()}
        out = super()._save_to_state_dict(destination, *args, **kwargs)
        new_states = [v for v in destination.values() if id(v) not in initial_states]
        self._mark_expert_parallel_weights(new_states)
        return out


class ExpertFusedColumnParallelLinear(layers.ColumnParallelLinear, ExpertFusedLinear):
    """Specialized linear layer for MoE, supporting column parallelism for all experts simultaneously.

    This class inherits from ColumnParallelLinear, and over-rides certain attributes and functions needed to enable
    column-parallel linear layer computation for 3D weights. The forward pass of the parent class is over-ridden
    to to support selective computations on a subset of experts.

    Sequence parallelism is handled independently of MLP computations in MoE, and therefore defaults to False.
    """

    autograd_func_class = ExpertFusedLinearWithAsyncCommunication

    def __init__(
        self,
        num_experts: int,
        input_size: int,
        output_size: int,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device] = None,
        stride: int = 1,
        init_method: Optional[Callable[..., Any]] = None,
        keep_master_weight: bool = False,
        tensor_model_parallel_group: Optional[ProcessGroup] = None,
        expert_model_parallel_group: Optional[ProcessGroup] = None,
        is_prefill: bool = True,
        is_fused_gate_up: bool = False,
        expert_distribution: Optional[List[List[int]]] = None,
    ) -> None:
        self.num_experts = num_experts
        if expert_model_parallel_group is None:
            expert_model_parallel_group = get_expert_model_parallel_group()
        if expert_distribution is None:
            self._n_local_experts = utils.divide(num_experts, expert_model_parallel_group.size())
        else:
            self._n_local_experts = len(expert_distribution[0])
        self.expert_model_parallel_group = expert_model_parallel_group
        self.is_prefill = is_prefill
        self.is_fused_gate_up = is_fused_gate_up
        super().__init__(
            input_size=input_size,
            output_size=output_size,
            bias=bias,
            gather_output=False,
            dtype=dtype,
            device=device,
            stride=stride,
            init_method=init_method,
            sequence_parallel_enabled=False,
            keep_master_weight=keep_master_weight,
            skip_bias_add=False,
            tensor_model_parallel_group=tensor_model_parallel_group,
        )
        self._mark_expert_parallel_weights(expert_parallel_group_size=expert_model_parallel_group.size(), is_prefill=is_prefill, expert_distribution=expert_distribution)

    def set_weight_and_bias_config(self):
        # Define 3D weight tensor, one linear layer per expert
        self.weight_shape = (
            self._n_local_experts,
            self.input_size,
            self.output_size_per_partition,
        )
        # Column parallel partitioning for each expert
        self.weight_partition_dim = 2

        if self.add_bias:
            bias_size = self.output_size if self.gather_output else self.output_size_per_partition
            self.bias_shape = (self._n_local_experts, bias_size)
            self.bias_partition_dim = 1
        else:
            self.bias_shape = None

    def _init_weight(self, weight):
        # Initialize the linear layer of each expert separately
        assert len(weight.shape) == 3
        for e in range(weight.shape[0]):
            if self.arg_init_method is None:
                torch.nn.init.kaiming_uniform_(weight[e], a=math.sqrt(5))
            else:
                self.arg_init_method(weight[e])

    def _init_bias(self) -> None:
        assert len(self.bias.shape) == 2
        for e in range(self.bias.shape[0]):
            fan_in, _ = torch.nn.init._calculate_fan_in_and_fan_out(self.weight[e])
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            torch.nn.init.uniform_(self.bias[e], -bound, bound)

    def forward(self, input_: torch.Tensor, expert_indices: Optional[torch.Tensor] = None, *_: Any) -> torch.Tensor:
        """If expert_indices is provided, then the computations are performed only on the specified experts.
        Otherwise, the input is passed through all experts in the layer."""

        if self.async_tensor_model_parallel_allreduce or self.sequence_parallel_enabled:
            input_parallel = input_
        else:
            input_parallel = mappings.copy_to_tensor_model_parallel_region(
                input_,
                process_group=self.tensor_parallel_group,
            )

        # Matrix multiply.
        weight = self.weight[expert_indices, :, :] if expert_indices is not None else self.weight
        output = self._forward_impl(
            input=input_parallel,
            weight=weight,
            bias=None,
            async_grad_allreduce=self.async_tensor_model_parallel_allreduce,
            sequence_parallel_enabled=self.sequence_parallel_enabled,
            autograd_func_class=self.autograd_func_class,
            process_group=self.tensor_parallel_group,
        )

        if self.bias is not None:
            if expert_indices is not None:
                bias = self.bias[expert_indices, :]
            else:
                bias = self.bias
            # input dimensions are (e, 1, c, h) or (e/ep, ep, c, h)
            # bias dimensions are always (e, h) or (e/ep, h)
            # outer dimensions will always be equal, we unsqueeze inner dimensions to 1s
            bias = bias.unsqueeze(1).unsqueeze(2)
        else:
            bias = None
        # Always add bias
        output = (output + bias) if bias is not None else output
        return output


class ExpertFusedRowParallelLinear(layers.RowParallelLinear, ExpertFusedLinear):
    """Specialized linear layer for MoE, supporting row parallelism for all experts simultaneously.

    This class inherits from RowParallelLinear, and over-rides certain attributes and functions needed to enable
    row-parallel linear layer computation for 3D weights. The forward pass of the parent class is over-ridden
    to optionally avoid the output all-reduce depending on the sequence parallel mode, and to support selective
    computations on a subset of experts.

    Sequence parallelism is handled independently of MLP computations in MoE, and therefore defaults to False.
    Note that if reduce_output=False and bias=True, bias needs to be divided by TP degree.
    """

    autograd_func_class = ExpertFusedLinearWithAsyncCommunication

    def __init__(
        self,
        num_experts: int,
        input_size: int,
        output_size: int,
        bias: bool = False,
        reduce_output: bool = True,
        dtype: torch.dtype = torch.float32,
        device: Optional[torch.device] = None,
        stride: int = 1,
        init_method: Optional[Callable[..., Any]] = None,
        keep_master_weight: bool = False,
        tensor_model_parallel_group: Optional[ProcessGroup] = None,
        expert_model_parallel_group: Optional[ProcessGroup] = None,
        is_prefill: bool = True,
        is_fused_gate_up: bool = False,
        expert_distribution: Optional[List[List[int]]] = None,
    ) -> None:
        self.num_experts = num_experts
        if expert_model_parallel_group is None:
            expert_model_parallel_group = get_expert_model_parallel_group()
        if expert_distribution is None:
            self._n_local_experts = utils.divide(num_experts, expert_model_parallel_group.size())
        else:
            self._n_local_experts = len(expert_distribution[0])
        self.expert_model_parallel_group = expert_model_parallel_group
        self.is_prefill = is_prefill
        self.is_fused_gate_up = is_fused_gate_up
        super().__init__(
            input_size=input_size,
            output_size=output_size,
            bias=bias,
            input_is_parallel=True,
            dtype=dtype,
            device=device,
            stride=stride,
            init_method=init_method,
            sequence_parallel_enabled=False,
            keep_master_weight=keep_master_weight,
            skip_bias_add=False,
            reduce_output=reduce_output,
            tensor_model_parallel_group=tensor_model_parallel_group,
        )

        self._mark_expert_parallel_weights(expert_parallel_group_size=expert_model_parallel_group.size(), is_prefill=is_prefill, expert_distribution=expert_distribution)

    def set_weight_and_bias_config(self):
        # Define 3D weight tensor, one linear layer per expert
        self.weight_shape = (
            self._n_local_experts,
            self.input_size_per_partition,
            self.output_size,
        )
        # Row parallel partitioning for each expert
        self.weight_partition_dim = 1

        if self.add_bias:
            bias_size = self.output_size
            self.bias_shape = (self._n_local_experts, bias_size)
        else:
            self.bias_shape = None

    def _init_weight(self, weight):
        # Initialize the linear layer of each expert separately
        assert len(weight.shape) == 3
        for e in range(weight.shape[0]):
            if self.arg_init_method is None:
                torch.nn.init.kaiming_uniform_(weight[e], a=math.sqrt(5))
            else:
                self.arg_init_method(weight[e])

    def _init_bias(self) -> None:
        assert len(self.bias.shape) == 2
        for e in range(self.bias.shape[0]):
            bound = 1 / math.sqrt(self.input_size_per_partition) if self.input_size_per_partition > 0 else 0
            torch.nn.init.uniform_(self.bias[e], -bound, bound)

    def forward(self, input_: torch.Tensor, expert_indices: Optional[torch.Tensor] = None) -> torch.Tensor:
        """If expert_indices is provided, then the computations are performed only on the specified experts.
        Otherwise, the input is passed through all experts in the layer."""

        # Matrix multiply.
        weight = self.weight[expert_indices, :, :] if expert_indices is not None else self.weight
        output_parallel = self._forward_impl(
            input=input_,
            weight=weight,
            bias=None,
            async_grad_allreduce=False,
            sequence_parallel_enabled=False,
            autograd_func_class=self.autograd_func_class,
            process_group=self.tensor_parallel_group,
        )

        if self.reduce_output:
            output = mappings.reduce_from_tensor_model_parallel_region(
                output_parallel, process_group=self.tensor_parallel_group,
            )
        else:
            # Return without output all-reduce, in favor of an all-reduce or reduce-scatter after the MoE output combine.
            output = output_parallel

        if self.bias is not None:
            if expert_indices is not None:
                bias = self.bias[expert_indices, :]
            else:
                bias = self.bias
            # input dimensions are (e, 1, c, h) or (e/ep, ep, c, h)
            # bias dimensions are always (e, h) or (e/ep, h)
            # outer dimensions will always be equal, we unsqueeze inner dimensions to 1s
            bias = bias.unsqueeze(1).unsqueeze(2)
        else:
            bias = None
        # Always add bias
        output = (output + bias) if bias is not None else output
        return output
