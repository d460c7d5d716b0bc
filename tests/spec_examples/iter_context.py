"""The API reference's example of IterContext: tasks pass values through ctx and free them with del."""
import torch

from sw_pipeline import IterContext

model = torch.nn.Linear(4, 2)  # the reference's model, left out

# -- as written --
def copy_batch(ctx: IterContext) -> None:
    ctx.x_gpu = ctx.batch["x"].to("cuda", non_blocking=True)
    ctx.y_gpu = ctx.batch["y"].to("cuda", non_blocking=True)

def forward(ctx: IterContext) -> None:
    ctx.logits = model(ctx.x_gpu)
    del ctx.x_gpu  # free GPU memory early

# -- checked --
ctx = IterContext({"x": torch.ones(3, 4), "y": torch.zeros(3)}, 0)
if torch.cuda.is_available():
    copy_batch(ctx)
else:
    ctx.x_gpu, ctx.y_gpu = ctx.batch["x"], ctx.batch["y"]  # copy_batch's effect, on the CPU
forward(ctx)
assert ctx.logits.shape == (3, 2) and not hasattr(ctx, "x_gpu") and ctx.iter_idx == 0
