"""Tutorial 06: training a convolutional network in PyTorch with te layers.

The 8×8 handwritten digits that scikit-learn ships (1,797 images, no
download) are classified by a small convolutional network whose conv,
pooling and dense layers are te programs, each turned into a differentiable
torch op by ``te_autodiff.torch.op``.  PyTorch holds the weights
(``nn.Parameter``), the loss and the optimizer; te-autodiff derives and
compiles every layer's forward and backward.  The same network in plain
PyTorch trains beside it on the same batches from the same weights: the
two losses agree to rounding over the first epoch, and both nets learn
alike (training amplifies rounding, as torch's own does).

The network lives in examples/digits_cnn.py, shared with the distributed
test and with torchrun (README, "Training on several machines").

Needs PyTorch, scikit-learn and matplotlib:  python -m pip install -e '.[torch,examples]'
Run it:  python tutorials/06_training_in_pytorch.py     (about 20 s; writes 06_loss_curve.png)
"""
import importlib.util
import pathlib
import sys
import time

import te_autodiff as te
import te_autodiff.torch as tet

needs = {"torch": "torch", "sklearn": "scikit-learn", "matplotlib": "matplotlib"}     # module: package
missing = [package for module, package in needs.items() if importlib.util.find_spec(module) is None]
if missing:
    print(f"Tutorial 06 needs PyTorch, scikit-learn and matplotlib; not installed: {', '.join(missing)}\n"
          "  python -m pip install -e '.[torch,examples]'")
    sys.exit(0)
import matplotlib  # noqa: E402  (the imports the check above guards)
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "examples"))
import digits_cnn as net  # noqa: E402  (found through the path just added)

# Step 1 -- the data: 8×8 grey images with 17 levels, scaled to [0, 1], and a
# fixed stratified split (seeded), so every run sees the same test set.
x_train, y_train, x_test, y_test = net.load_data()
print(f"Step 1: {len(x_train)} training and {len(x_test)} test images of shape {tuple(x_train.shape[1:])}; "
      f"the first is a {y_train[0].item()}:")
for row in x_train[0, 0]:
    print("  " + "".join(" .:#"[min(3, int(v * 4))] for v in row))

# Step 2 -- one layer as a te program: a 3×3 convolution with zero padding,
# a bias and a relu.  The padding is a select on the image bounds; the relu
# is a select on conv > 0, whose gradient at 0 is 0 as in torch.
(X, W, b), relu = net.conv3x3_relu(4, 1, net.C1, net.SIZE, "float32")
print("\nStep 2: the first layer as a formula")
print(te.pretty(relu))
# Its weight gradient, derived by te.gradient: zero elimination has turned
# the padding select into bounds on y and x, so the sum visits only the taps
# that read inside the image.
H = te.placeholder(relu.shape, "float32", name="H")
print("its weight gradient (H: the gradient arriving from the next layer)")
print(te.pretty(te.gradient(relu, [W], head=H)[0]))

# Step 3 -- the layer as a torch op: tensors in, tensors out, differentiable.
# Its forward and its gradients agree with torch's own conv2d and relu.
conv = tet.op([X, W, b], relu)
x = x_train[:4]
w = (0.3 * torch.randn(net.C1, 1, 3, 3)).requires_grad_()
bias = (0.1 * torch.randn(net.C1)).requires_grad_()
ours = conv(x, w, bias)
theirs = F.relu(F.conv2d(x, w, bias, padding=1))
head = torch.randn(ours.shape)
grads = torch.autograd.grad((ours * head).sum(), (w, bias))
want = torch.autograd.grad((theirs * head).sum(), (w, bias))
print("\nStep 3: the te op against torch's conv2d + relu, largest differences:")
print(f"  forward {(ours - theirs).abs().max().item():.1e}   "
      f"dW {(grads[0] - want[0]).abs().max().item():.1e}   db {(grads[1] - want[1]).abs().max().item():.1e}")
torch.testing.assert_close(ours, theirs)
for g, r in zip(grads, want):
    torch.testing.assert_close(g, r)

# Step 4 -- the whole network as a torch.nn.Module: conv-relu, maxpool,
# conv-relu, maxpool, dense, each a te op, the weights nn.Parameters.  Its
# twin TorchNet computes the same layers with torch.nn.functional, and
# starts from the same weights.  te kernels have fixed shapes, so the net
# builds its five ops once per batch size: the 64 of a training batch here
# (forward and backward), the 450 of the test set in step 6 (forward only).
te_net, torch_net = net.TeNet(), net.TorchNet()
torch_net.load_state_dict(te_net.state_dict())
print(f"\nStep 4: the network, {sum(p.numel() for p in te_net.parameters())} weights:")
for name, p in te_net.named_parameters():
    print(f"  {name:8s} {tuple(p.shape)}")
start = time.perf_counter()
loss = F.cross_entropy(te_net(x_train[:net.BATCH]), y_train[:net.BATCH])
loss.backward()
print(f"building the 5 forward and 5 backward kernels and one step: {time.perf_counter() - start:.1f} s")
te_net.zero_grad()

# Step 5 -- train both side by side: the same shuffled batches of 64 (the
# last partial batch of each epoch is dropped), Adam on each, the mean
# cross-entropy.  The two losses differ by float32 rounding: the te kernels
# sum in another order than torch's (a bias gradient over the batch in
# several partial sums, say), and the weights carry those differences from
# step to step.  Over the first epoch the losses agree to rounding.  Training
# is chaotic, though: where a value sits within rounding of a relu's 0, or
# two values of a max-pool window tie, the nets can decide differently, and
# Adam, which divides each step by the gradient's running size, turns a
# difference in the last bits into a full step.  So later losses may part
# by more (torch against itself parts as much when one gradient is rounded
# differently); what must hold is that both learn alike.
opt_te, opt_torch = net.optimizer(te_net.parameters()), net.optimizer(torch_net.parameters())
losses_te, losses_torch = [], []
steps_per_epoch = len(x_train) // net.BATCH
print(f"\nStep 5: {net.EPOCHS} epochs of {steps_per_epoch} steps, te and torch side by side")
for step, idx in enumerate(net.batches(len(x_train))):
    losses_te.append(net.train_step(te_net, opt_te, x_train[idx], y_train[idx]))
    losses_torch.append(net.train_step(torch_net, opt_torch, x_train[idx], y_train[idx]))
    if (step + 1) % (5 * steps_per_epoch) == 0:
        print(f"  epoch {(step + 1) // steps_per_epoch:2d}: loss te {losses_te[-1]:.5f}  torch {losses_torch[-1]:.5f}")


def largest_gap(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


first = largest_gap(losses_te[:steps_per_epoch], losses_torch[:steps_per_epoch])
gap = largest_gap(losses_te, losses_torch)
print(f"largest difference of the losses: first epoch {first:.2e}, all {len(losses_te)} steps {gap:.2e}")
last_te = sum(losses_te[-steps_per_epoch:]) / steps_per_epoch
last_torch = sum(losses_torch[-steps_per_epoch:]) / steps_per_epoch
print(f"mean loss of the last epoch: te {last_te:.5f}, torch {last_torch:.5f}")
assert first < 1e-5, first
assert last_te < 0.01 and last_torch < 0.01, (last_te, last_torch)

# Step 6 -- the test set: 450 images the networks never trained on, in one
# batch (a second set of forward kernels, built for 450 images).
acc_te, acc_torch = net.accuracy(te_net, x_test, y_test), net.accuracy(torch_net, x_test, y_test)
print(f"\nStep 6: test accuracy te {acc_te:.2%}, torch {acc_torch:.2%}")
assert acc_te >= 0.95 and abs(acc_te - acc_torch) <= 0.02, (acc_te, acc_torch)

# Step 7 -- the loss curves: the two lie on top of each other until rounding
# parts them, and then run side by side.
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the Agg backend)

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.semilogy(losses_torch, color="tab:orange", linewidth=3, alpha=0.5, label="plain PyTorch")
ax.semilogy(losses_te, color="tab:blue", linewidth=1, label="te layers")
ax.set(xlabel="step (batch of 64)", ylabel="cross-entropy",
       title=f"digits CNN: test accuracy {acc_te:.1%}, losses within {gap:.0e}")
ax.legend()
fig.savefig("06_loss_curve.png", dpi=100, bbox_inches="tight")
plt.close(fig)
print("\nStep 7: loss curves saved to 06_loss_curve.png")
