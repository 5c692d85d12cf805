import gc, time, sys, torch, torchvision
from bench.host_meters import GcPauses
from fastload import FastLoader
from fastload.benchmark import open_dataset, loader_shape
torch.set_num_threads(1)
model = torchvision.models.resnet50(num_classes=10)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
def step(x, y):
    loss = torch.nn.functional.cross_entropy(model(x), y % 10)
    opt.zero_grad(); loss.backward(); opt.step()
ds = open_dataset("data/imagenet-like.seekable.lmdb")
print("tracked", len(gc.get_objects()))
for mode in sys.argv[1:]:
    l = FastLoader(ds, batch_size=8, device="cpu", drop_last=True, **loader_shape("trivialaugment", 32))
    fixed = next(iter(l))
    p = GcPauses(); steps = 0; t = time.time()
    with p.installed():
        for e in range(1):
            l.set_epoch(e)
            it = iter(l) if mode == "loader" else iter([fixed] * len(l))
            for x, y in it:
                step(x, y); steps += 1
    print(mode, steps, "steps", f"{time.time()-t:.1f} s", p.summary(), flush=True)
    l.close()
