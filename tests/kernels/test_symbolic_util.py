import torch

from framejit.kernels.reference import ReferenceLauncher

from .symbolic import dynamic_launcher


def test_reference_launcher_runs_a_kernel_with_run_time_sizes():
    def fn(x, b):
        return torch.softmax(x + b, dim=-1)

    launcher, static, values = dynamic_launcher(fn, (torch.randn(4, 6), torch.randn(6)), [0, 1],
                                                ReferenceLauncher)
    assert [s.name for s in launcher.kernel.symbols()] == ["ks0", "ks1"]
    for n, m in [(4, 6), (3, 11), (7, 2)]:
        x, b = torch.randn(n, m), torch.randn(m)
        out = launcher(x, b, n, m)
        torch.testing.assert_close(out, fn(x, b))
