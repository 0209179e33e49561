"""The MindSpore and MindFormers APIs this package reaches that are private or have moved
between releases, one adapter per concern; every other module reaches them through these.

- `releases.py`: which MindSpore / MindFormers are installed, the range they are tested in,
  and the one warning outside it;
- `lookup.py`: a name resolved where an adapter expects it, or `ApiNotFound` naming the
  installed release, the name and what needs it; a feature turned off once, said once;
- `mindspore_model.py`: `Model.train`'s internals: the `cb_params` keys read, the frames of
  its loop and its `initial_epoch` argument;
- `mindspore_tensor.py`: the readback of a one-element tensor (`Tensor._item`);
- `mindspore_cell.py`: `nn.Cell`'s compile cache, child cells and child replacement (the
  gradient-norm probe);
- `profiler.py`: `mindspore.profiler`'s public API and the private CPU parser the
  `capture --analyse` command runs;
- `mindformers_api.py`: MindFormers' trainer, config templates, callbacks and resume loads.

`tests/test_compat.py` checks each adapter against the installed releases; the version
matrix (scripts/matrix.sh) runs it on every pair that installs.
"""
