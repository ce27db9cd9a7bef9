"""`tracelens analyze --ops` prints trace strings as text: a kernel's `[direct_copy_kernel_cuda]` functor (or any
bracketed name) is not taken for rich markup and dropped (issue 21 verification)."""

from __future__ import annotations

from tracelens.commands.analyze import print_ops_table


def test_bracketed_kernel_and_op_names_are_printed_verbatim(capsys):
    row = dict.fromkeys(("flops", "bytes", "tflops", "tbps", "bound", "roofline_pct", "shapes"))
    rows = [
        {**row, "op": "aten::copy_", "kernel": "elementwise_kernel<…>[direct_copy_kernel_cuda]", "stage": 0,
         "rank": 0, "layer_type": "linear_attention", "calls": 1026.0, "ms_per_step": 3.7014},
        {**row, "op": "[bold]my_op[/bold]", "kernel": "reduce_kernel<…>[sum_functor]", "stage": 1, "rank": 4,
         "layer_type": "[mlp]", "calls": 2.0, "ms_per_step": 1.5},
    ]  # fmt: skip
    print_ops_table({"ops": rows})
    out = capsys.readouterr().out
    assert "elementwise_kernel<…>[direct_copy_kernel_cuda]" in out
    assert "reduce_kernel<…>[sum_functor]" in out and "[bold]my_op[/bold]" in out and "[mlp]" in out
    assert out.index("3.701") < out.index("1.500")  # longest first
