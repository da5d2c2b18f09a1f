"""ATen ops that launch no GPU kernel (views, allocations, metadata, scalar reads), by name without the
``aten::`` prefix: what the launch counts of ``op_count.py`` and ``train_step.py`` skip."""

INERT_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "view", "view_as", "_unsafe_view", "reshape", "_reshape_alias",
    "as_strided", "resize_", "set_", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "slice",
    "select", "split", "split_with_sizes", "chunk", "unbind", "narrow", "unflatten", "flatten", "diagonal",
    "view_as_real", "alias", "detach", "lift", "lift_fresh", "contiguous", "type_as", "resolve_conj",
    "promote_types", "result_type", "scalar_tensor", "is_same_size", "size", "stride", "item",
    "_local_scalar_dense", "is_nonzero",
})
