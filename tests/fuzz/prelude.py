"""The fixed top of every generated module: imports, globals, user classes, helpers and the input
builder. Each definition is its own node so that the shrinker can drop the ones a failing program
does not need.

The inputs of ``f(x, y, lst, d, obj)`` in symbolic shapes (A, B are sizes that change between the
first two calls and the third):

- ``x``: float32 (A, B); ``y``: float32 (B,)
- ``lst``: a list of float32 (B,) tensors, never shorter than 1 (the generator guards its pops)
- ``d``: ``{'a': (A, B) tensor, 'n': int}``
- ``obj``: a ``Box`` with ``t`` (A, B), ``n`` (int), ``log`` (list of str)
- other dtypes: ``d['i']`` int64 (A, B), ``d['q']`` int8 (B,), ``d['b']`` bfloat16 (B,),
  ``obj.h`` float16 (A, B), ``obj.u`` uint8 (A, B), ``obj.i`` int32 (B,)

In some programs two inputs are one tensor or overlapping views of one (ALIASED_INPUTS), and
the calls on new sizes get inputs laid out otherwise (LAYOUTS). The modules (MODULES: ``GLIN``,
``GLN``, ``GBN`` training, ``GDROP``, ``GCNT``, ``GSEQ``) are globals, so each side's module
has its own, compared after every call.
"""

from __future__ import annotations

from .program import Line

IMPORTS = "import contextlib\nimport dataclasses\nimport torch"

GLOBALS = "G0 = 3\nGF = 0.5\nGL = []\nGD = {'calls': 0}\nGT = torch.ones(1)"

BOX = """\
class Box:
    def __init__(self, t, n):
        self.t = t
        self.n = n
        self.log = []

    def scale(self, u):
        return u * self.n

    def bump(self, k=1):
        self.n += k
        return self.n

    @property
    def double(self):
        return self.n * 2"""

PAIR = """\
@dataclasses.dataclass
class Pair:
    a: object
    b: int = 0

    def total(self):
        return self.a * self.b"""

# A context manager whose __enter__ and __exit__ have side effects the caller can see.
CTX = """\
class Ctx:
    def __init__(self, log, tag):
        self.log = log
        self.tag = tag

    def __enter__(self):
        self.log.append('enter ' + self.tag)
        return self

    def __exit__(self, kind, value, tb):
        self.log.append('exit ' + self.tag)
        return False"""

TRACKED = """\
@contextlib.contextmanager
def tracked(log, tag):
    log.append('open ' + tag)
    try:
        yield len(log)
    finally:
        log.append('close ' + tag)"""

GEN = """\
def scaled(t, k):
    for i in range(k):
        yield t * (i + 1)"""

# A helper that breaks the graph inside an inlined call (print).
NOISY = """\
def noisy(u):
    print('noisy', tuple(u.shape))
    return u + 1"""

HELPER = """\
def helper(u, k):
    if k > 2:
        return u * k
    return u - k"""


# State that f reads through a user function's default value, a method's decorator closure and
# a class attribute read through type(self). perturb(), which runner.py calls between calls on
# each side, changes it from outside, and the modules' attributes and children: the compiled
# code must see that (guards), where capture had taken the first three as fixed.
CONFIG = """\
GC = {'k': 2}


def with_cfg(cfg):
    def deco(fn):
        def inner(self, u):
            return fn(self, u) * cfg['k']
        return inner
    return deco


class Tab:
    T = {'k': 3}

    def tab_scaled(self, u):
        return u * type(self).T['k']

    @with_cfg(GC)
    def tab_cfg(self, u):
        return u + 1

    def tab_step(self, u):
        return u + 2

    @property
    def tab_k(self):
        return 2


def _tab_step_other(self, u):
    return u * 2


TAB = Tab()


def cfg_scaled(u, cfg=GC):
    return u * cfg['k']


def cfg_shifted(u):
    return u - 1


def _shifted_other(u):
    return u + 3


_PERTURBED = {'step': _tab_step_other, 'k': property(lambda self: 5),
              'code': _shifted_other.__code__}


def perturb():
    GC['k'] += 1
    Tab.T['k'] -= 1
    # what a class defines and a function's code, replaced (guarded by identity)
    Tab.tab_step, _PERTURBED['step'] = _PERTURBED['step'], Tab.tab_step
    Tab.tab_k, _PERTURBED['k'] = _PERTURBED['k'], Tab.tab_k
    cfg_shifted.__code__, _PERTURBED['code'] = _PERTURBED['code'], cfg_shifted.__code__
    if 'GCNT' in globals():  # (MODULES, unless the shrinker dropped it)
        GCNT.flag = not GCNT.flag
        GLN.eps = GLN.eps * 10
        GSEQ[1] = torch.nn.Tanh() if isinstance(GSEQ[1], torch.nn.ReLU) else torch.nn.ReLU()
        if len(GSEQ) == 3:  # a layer appended, then taken away
            GSEQ.append(torch.nn.Tanh())
        else:
            del GSEQ[3]


def perturb_inputs(x, y, lst, d, obj):
    d['n'] += 1
    obj.n -= 1
    obj.log.append('p')
    lst.append(lst[-1] * 2)
    y.add_(0.5)"""


# Module globals (named G*, so that runner compares their state after every call: parameters,
# buffers and attributes). Seeded, so that each side's fresh copy starts equal. GBN trains: its
# running statistics change on every call; GCNT's forward writes an attribute and a buffer (a
# sum without infinities: the largest floats' sum overflows or not by the order of its adds).
MODULES = """\
class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.count = 0
        self.flag = False
        self.scale = torch.nn.Parameter(torch.tensor(1.5))
        self.register_buffer('total', torch.zeros(()))

    def forward(self, u):
        self.count += 1
        self.total += u.detach().float().nan_to_num(0.0, 0.0, 0.0).sum()
        if self.flag:
            return u * self.scale - self.count
        return u * self.scale + self.count

torch.manual_seed(7)
GLIN = torch.nn.Linear(1, 1)
GLN = torch.nn.LayerNorm(2)
GBN = torch.nn.BatchNorm1d(1)
GDROP = torch.nn.Dropout(0.5).eval()
GCNT = Counter()
GSEQ = torch.nn.Sequential(torch.nn.Linear(1, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))"""

# Inputs that alias each other (the same tensor, or overlapping views of one), for some
# programs: each keeps the type the generator's scope gives its name.
ALIASED_INPUTS = [
    "d['a'] = x", "obj.t = x[:]", "lst[0] = x[0]", "y = x[-1]", "lst[-1] = y", "obj.t = d['a']",
    "d['a'] = obj.t.view(obj.t.shape)", "lst[0] = obj.t[0]\n    lst.append(lst[0])",
]

# Inputs of the same values laid out otherwise (transposed, strided), for the calls on new
# sizes of some programs: a capture then meets an input that is not contiguous where the one
# before was.
LAYOUTS = [
    "x = x.t().contiguous().t()", "d['a'] = d['a'].t().contiguous().t()",
    "obj.t = torch.stack([obj.t, obj.t], -1)[..., 0]", "y = torch.stack([y, y], -1)[:, 1]",
    "obj.h = obj.h.t().contiguous().t()", "d['i'] = d['i'].t().contiguous().t()",
]

# Edge values for some programs: NaN and inf where the kernels' min/max/argmax and comparisons
# must propagate them as eager does, signed zeros, fp16 ties, and the integers' extremes.
SPECIAL = """
    d['a'][0, -1] = float('nan')
    obj.t[-1, 0] = float('inf')
    x[0] = 0.0
    y[-1] = -0.0
    obj.h[0, 0] = 0.1
    obj.h[-1, -1] = -2048.0
    d['b'][0] = 0.5
    d['i'][0] = 0
    d['q'][0], d['q'][-1] = -128, 127
    obj.u[0, 0], obj.u[-1, -1] = 0, 255
    obj.i[0] = -2**31"""


def make_inputs_source(sizes: list[tuple[int, int, int]], input_seed: int, special: bool = False,
                       aliased: str = "", layout: str = "") -> str:
    """``make_inputs(variant)``: the same values for the same variant, from a seeded generator, so
    that the eager and the compiled run start from equal inputs; with ``special``, some edge
    values too."""
    edges = SPECIAL if special else ""
    if layout:
        edges += f"\n    if variant:\n        {layout}"
    if aliased:
        edges += "\n    " + aliased
    return f"""\
SIZES = {sizes!r}

def make_inputs(variant):
    A, B, L = SIZES[variant]
    g = torch.Generator().manual_seed({input_seed} + variant)
    x = torch.randn(A, B, generator=g)
    y = torch.randn(B, generator=g)
    lst = [torch.randn(B, generator=g) for _ in range(L)]
    d = {{'a': torch.randn(A, B, generator=g), 'n': 2}}
    obj = Box(torch.randn(A, B, generator=g), 2)
    d['i'] = torch.randint(-8, 9, (A, B), generator=g)
    d['q'] = torch.randint(-128, 128, (B,), generator=g, dtype=torch.int8)
    d['b'] = torch.randn(B, generator=g).bfloat16()
    obj.h = (torch.randn(A, B, generator=g) * 2).half()
    obj.u = torch.randint(0, 256, (A, B), generator=g, dtype=torch.uint8)
    obj.i = torch.randint(-50, 50, (B,), generator=g, dtype=torch.int32){edges}
    return x, y, lst, d, obj"""


def prelude_nodes(sizes, input_seed, special=False, aliased="", layout="") -> list:
    """The module's nodes before ``f``. make_inputs is kept by the shrinker: without it nothing
    runs."""
    nodes = [Line(IMPORTS), Line(GLOBALS)]
    nodes += [Line(src) for src in (BOX, PAIR, CTX, TRACKED, GEN, NOISY, HELPER, CONFIG, MODULES)]
    nodes.append(Line(make_inputs_source(sizes, input_seed, special, aliased, layout), keep=True))
    return nodes
