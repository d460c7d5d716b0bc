"""The API reference's example of PipelineTask: a name, a function, and DeclaredIO for external side effects."""
from sw_pipeline import DeclaredIO, PipelineTask

copy_batch_fn = forward_fn = backward_fn = emb_fn = lambda ctx: None  # left out by the reference
table = {}
capture_emb, restore_emb = (lambda: dict(table)), table.update

# -- as written --
h2d = PipelineTask("CopyBatch", copy_batch_fn)
fwd = PipelineTask("Forward", forward_fn)
bwd = PipelineTask("Backward", backward_fn)

# with DeclaredIO for tasks with external side effects
emb = PipelineTask("EmbLookup", emb_fn, io=[
    DeclaredIO(capture=capture_emb, restore=restore_emb),
])

# -- checked --
# __hash__ and __eq__ are based on name, so tasks can serve as schedule keys
keys = {h2d: 0, fwd: 1, bwd: 2, emb: 3}
assert keys[PipelineTask("Forward", print)] == 1 and keys["EmbLookup"] == 3
assert fwd == PipelineTask("Forward", len) and hash(fwd) == hash("Forward") and fwd != bwd
assert emb.io[0].capture is capture_emb and h2d.io == []
