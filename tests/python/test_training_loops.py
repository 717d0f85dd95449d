"""HF Trainer and accelerate on openreg: Notes [HF Trainer's device with
openreg] and [accelerate across processes with openreg] in
torch_openreg/_huggingface.py.

Each configuration runs in a fresh subprocess: both libraries read the
environment once per process and keep global state. A tiny GPT-2 built from
a config (nothing downloaded) trains a few SGD steps; openreg runs are
compared with the same training on CPU.
"""

import base64
import importlib.util

import pytest
import torch

from _openreg_util import clean_env, script

# Looked up, not imported: importing them here would run openreg's hooks in
# the test process, whose environment every later script inherits.
for _library in ("transformers", "accelerate"):
    if importlib.util.find_spec(_library) is None:
        pytest.skip(
            f"{_library} is not installed (pip install -r requirements-training.txt)", allow_module_level=True
        )


def _env(**overrides):
    """This process's environment without the variables these tests set."""
    unset = dict.fromkeys(["ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_CPU", "WORLD_SIZE", "RANK", "LOCAL_RANK"])
    return clean_env(**{**unset, **overrides})


# Imports the libraries recording openreg's warnings, and defines
# train(batch_size, steps, **training_arguments): RESULT["params"] holds the
# parameters before the first step and after each (float32, base64).
_TRAINER = """
import base64
import torch
torch.set_num_threads(1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
RESULT["warnings"] = [str(w.message) for w in caught if "torch_openreg" in str(w.message)]

def flat(model):
    values = torch.cat([p.detach().cpu().flatten() for p in model.parameters()])
    return base64.b64encode(values.numpy().tobytes()).decode()

class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 10  # a batch of 4 leaves a last batch of 2

    def __getitem__(self, i):
        ids = torch.randint(0, 100, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}

class Snapshots(TrainerCallback):
    def on_step_end(self, args, state, control, model=None, **kwargs):
        RESULT["params"].append(flat(model))

def train(batch_size, steps, **options):
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    model = GPT2LMHeadModel(config)
    RESULT["params"] = [flat(model)]
    args = TrainingArguments(
        output_dir="trainer-output", max_steps=steps, per_device_train_batch_size=batch_size,
        optim="sgd", learning_rate=0.1, lr_scheduler_type="constant", train_sampling_strategy="sequential",
        report_to=[], save_strategy="no", logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True,
        **options,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Snapshots()])
    trainer.train()
    RESULT.update(
        args_device=str(args.device),
        world_size=args.world_size,
        parallel_mode=str(args.parallel_mode),
        accelerator_device=str(trainer.accelerator.device),
        distributed_type=str(trainer.accelerator.distributed_type),
        param_device=str(next(model.parameters()).device),
        wrapped=type(trainer.model_wrapped).__name__,
        steps=trainer.state.global_step,
        device_variable=os.environ.get("ACCELERATE_TORCH_DEVICE"),
    )
"""

# Runs RANK_CODE (a script that fills RESULT) on 2 processes under torchrun
# with a deadline; each rank writes its RESULT to rank<RANK>.json.
_LAUNCH = """
import signal, socket, subprocess
with open("rank.py", "w") as f:
    f.write(RANK_CODE)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
            "--master_addr", "127.0.0.1", "--master_port", str(port)]
proc = subprocess.Popen([*torchrun, "rank.py"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                        start_new_session=True)
try:
    output, _ = proc.communicate(timeout=DEADLINE_S)
except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # torchrun and its ranks
    output, _ = proc.communicate()
ranks = []
for rank in range(2):
    path = f"rank{rank}.json"
    ranks.append(json.load(open(path)) if os.path.exists(path) else None)
done({"returncode": proc.returncode, "ranks": ranks, "output": output[-6000:]})
"""
_RANK_PRELUDE = "import json, os, warnings\nRESULT = {}\n"
_RANK_EPILOGUE = """
with open(f"rank{os.environ['RANK']}.json", "w") as f:
    json.dump(RESULT, f)
"""

_DEADLINE_S = 150


def _two_processes(name, rank_code, env):
    rank_code = _RANK_PRELUDE + rank_code + _RANK_EPILOGUE
    code = f"RANK_CODE = {rank_code!r}\nDEADLINE_S = {_DEADLINE_S}\n" + _LAUNCH
    return script(name, code, env=_env(GLOO_SOCKET_IFNAME="lo", **env), timeout=_DEADLINE_S + 30)


def _ranks(s):
    result = s.result().check_ok()
    assert result["returncode"] == 0 and None not in result["ranks"], result["output"]
    return result["ranks"]


def _params(encoded):
    return torch.frombuffer(bytearray(base64.b64decode(encoded)), dtype=torch.float32)


def _assert_trained_alike(got, want):
    """Parameters after each step equal; and training moved them, so the
    comparison is not vacuous."""
    assert len(got) == len(want)
    assert (_params(want[-1]) - _params(want[0])).abs().max() > 1e-3
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(_params(g), _params(w), rtol=1e-6, atol=1e-7, msg=lambda m: f"step {step}: {m}")


# ------------------------------------------------------------ one process

_IMPORTED_WITH_OPENREG = """
import torch_openreg
RESULT["imported_with_openreg"] = sorted(m for m in sys.modules if m.split(".")[0] in ("transformers", "accelerate"))
"""

NOTHING_ASKED = script(
    "trainer_nothing_asked",
    _IMPORTED_WITH_OPENREG
    + _TRAINER
    + "train(4, 3)\ndone(RESULT)\n",
    env=_env(),
    timeout=120,
)
ON_OPENREG = script(
    "trainer_on_openreg",
    _TRAINER + "train(4, 3)\ndone(RESULT)\n",
    env=_env(ACCELERATE_TORCH_DEVICE="openreg"),
    timeout=120,
)
USE_CPU = script("trainer_use_cpu", _TRAINER + "train(4, 3, use_cpu=True)\ndone(RESULT)\n", env=_env(), timeout=120)


@pytest.mark.subprocess
def test_importing_openreg_imports_neither_library():
    assert NOTHING_ASKED.result().check_ok()["imported_with_openreg"] == []


@pytest.mark.subprocess
def test_trainer_with_nothing_asked_trains_on_cpu():
    """Without openreg's default, this run's first step mixed openreg:0 and
    CPU tensors."""
    result = NOTHING_ASKED.result().check_ok()
    assert result["device_variable"] == "cpu"
    assert (result["args_device"], result["accelerator_device"], result["param_device"]) == ("cpu", "cpu", "cpu")
    assert result["steps"] == 3
    assert result["warnings"] == []
    _assert_trained_alike(result["params"], USE_CPU.result().check_ok()["params"])


@pytest.mark.subprocess
def test_trainer_use_cpu_trains_on_cpu():
    result = USE_CPU.result().check_ok()
    assert result["warnings"] == []
    assert (result["args_device"], result["accelerator_device"], result["param_device"]) == ("cpu", "cpu", "cpu")
    assert result["steps"] == 3


@pytest.mark.subprocess
def test_trainer_on_openreg_matches_cpu():
    result = ON_OPENREG.result().check_ok()
    assert result["device_variable"] == "openreg"
    assert result["args_device"] == "openreg"
    assert result["accelerator_device"] == "openreg"
    assert result["param_device"] == "openreg:0"
    assert (result["steps"], result["world_size"], result["parallel_mode"]) == (3, 1, "ParallelMode.NOT_PARALLEL")
    assert result["warnings"] == []
    _assert_trained_alike(result["params"], USE_CPU.result().check_ok()["params"])


# ---------------------------------------------------------- two processes

_ACCELERATE_RANK = """
import torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from accelerate import Accelerator
RESULT["warnings"] = [str(w.message) for w in caught if "torch_openreg" in str(w.message)]
accelerator = Accelerator(cpu=CPU)
RESULT.update(
    process=[accelerator.process_index, accelerator.num_processes],
    distributed_type=str(accelerator.distributed_type),
    device=str(accelerator.device),
)
if TRAIN:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    initial = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))
    y = torch.randn(16, 1, generator=torch.Generator().manual_seed(2))
    data = torch.utils.data.TensorDataset(torch.arange(16), x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    RESULT.update(wrapped=type(model).__name__, samples=[], grads=[])
    for index, xb, yb in loader:
        RESULT["samples"].append(index.tolist())
        RESULT["batch_device"] = str(xb.device)
        accelerator.backward(torch.nn.functional.mse_loss(model(xb), yb))
        RESULT["grads"].append(torch.cat([p.grad.flatten() for p in model.parameters()]).tolist())
        optimizer.step()
        optimizer.zero_grad()
    RESULT["params"] = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    RESULT["param_device"] = str(next(model.parameters()).device)
    # One process on CPU, the batches of both ranks at once.
    reference = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    with torch.no_grad():
        for p, p0 in zip(reference.parameters(), initial):
            p.copy_(p0)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    RESULT["reference_grads"] = []
    for start in range(0, 16, 8):
        torch.nn.functional.mse_loss(reference(x[start:start + 8]), y[start:start + 8]).backward()
        RESULT["reference_grads"].append(torch.cat([p.grad.flatten() for p in reference.parameters()]).tolist())
        optimizer.step()
        optimizer.zero_grad()
    RESULT["reference_params"] = torch.cat([p.detach().flatten() for p in reference.parameters()]).tolist()
"""

ACCELERATE_UNASKED = _two_processes(
    "accelerate_two_processes_unasked", "CPU = False\nTRAIN = False\n" + _ACCELERATE_RANK, env={}
)
ACCELERATE_OVER_GLOO = _two_processes(
    "accelerate_two_processes_over_gloo",
    "CPU = True\nTRAIN = True\n" + _ACCELERATE_RANK,
    env={"ACCELERATE_TORCH_DEVICE": "openreg"},
)
TRAINER_OVER_GLOO = _two_processes(
    "trainer_two_processes_over_gloo",
    _TRAINER + "train(2, 2, use_cpu=True)\n",
    env={"ACCELERATE_TORCH_DEVICE": "openreg"},
)


@pytest.mark.subprocess
def test_accelerate_unasked_warns_that_each_process_trains_alone():
    for rank in _ranks(ACCELERATE_UNASKED):
        # accelerate 1.16 on openreg, launched as one of 2: not distributed
        assert rank["process"] == [0, 1] and rank["distributed_type"] == "DistributedType.NO", rank
        assert len(rank["warnings"]) == 1, rank
        warning = rank["warnings"][0]
        for words in ("accelerate", "openreg", "each process trains alone", "ACCELERATE_TORCH_DEVICE=openreg",
                      "Accelerator(cpu=True)", "TrainingArguments(use_cpu=True)", "DistributedDataParallel"):
            assert words in warning, warning


@pytest.mark.subprocess
def test_accelerate_over_gloo_matches_one_process():
    ranks = _ranks(ACCELERATE_OVER_GLOO)
    for index, rank in enumerate(ranks):
        assert rank["warnings"] == []
        assert rank["process"] == [index, 2]
        assert rank["distributed_type"] == "DistributedType.MULTI_CPU"
        assert rank["device"] == "openreg"
        assert (rank["batch_device"], rank["param_device"]) == ("openreg:0", "openreg:0")
        assert rank["wrapped"] == "DistributedDataParallel"
        # batches of 4, dealt to the ranks in turn
        assert rank["samples"] == [list(range(4 * b, 4 * b + 4)) for b in (index, index + 2)]
        # averaged over gloo: the gradient of both ranks' batches at once
        torch.testing.assert_close(rank["grads"], ranks[0]["reference_grads"], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(rank["params"], ranks[0]["reference_params"], rtol=1e-6, atol=1e-7)


@pytest.mark.subprocess
def test_trainer_over_gloo_matches_one_process():
    """Batches of 2 on each of 2 processes, 2 steps: the first 2 steps of
    the one-process CPU training with batches of 4."""
    ranks = _ranks(TRAINER_OVER_GLOO)
    reference = USE_CPU.result().check_ok()["params"][:3]
    for rank in ranks:
        assert rank["warnings"] == []
        assert (rank["args_device"], rank["world_size"], rank["parallel_mode"]) == (
            "openreg", 2, "ParallelMode.DISTRIBUTED")
        assert rank["distributed_type"] == "DistributedType.MULTI_CPU"
        assert (rank["param_device"], rank["wrapped"]) == ("openreg:0", "DistributedDataParallel")
        _assert_trained_alike(rank["params"], reference)
