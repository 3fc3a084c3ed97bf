"""Imported last by a forkserver's preload (:func:`common.alternate_in_workers`): freezes what the
preload imported (``gc.freeze``), so that the workers forked from it neither walk those objects in
their full collections nor copy their pages by touching them."""

import gc

gc.freeze()
