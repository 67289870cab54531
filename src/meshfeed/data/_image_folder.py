"""A folder of image files as a source: ``ImageFolderSource``.

The layout most vision data sets come in is a folder with a subfolder per class
(ImageNet's, torchvision's ``ImageFolder``): ``train/n01440764/a.JPEG`` is an image of
class ``n01440764``. ``ImageFolderSource`` reads it as torchvision does -- the classes
are the subfolders' names, sorted, their index the label; the images are each class's
files with an image extension, walked in sorted order (symbolic links followed) -- and
serves each example as its file's bytes (``image``, a ragged ``uint8`` field: decode
them in a record transform, ``meshfeed.vision``) and its ``label``.

Listing a million files costs a thousand requests on an object store and minutes on a
network file system, and every host of a job would list the same folder at every start.
So the first open lists it once and keeps the result beside it,
``<root>/meshfeed.images.json`` (each file's path under the root, its size and label,
and the classes; or under ``catalog=``); every later open, on any host, reads that one
object and nothing else before a step's first read. A file is then read whole in one
request (its size is known), locally by ``pread`` through the process's bounded pool of
open files. A catalog over files that changed since is rebuilt with
``rebuild_catalog=True``; a file gone or cut short since fails at its read, by name (a
cut one as a bad record: ``on_error="skip"`` skips it).

A list of files, or a glob, with a ``label`` function is the other way in, for layouts
that are not a class per folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from meshfeed.data._folder import join, read_json
from meshfeed.data._ragged import Ragged
from meshfeed.data._sources import FieldSpec, check_ids, example_at, fields_text
from meshfeed.data._writer import FolderWriter
from meshfeed.storage._blob import Blob, is_url, require_fsspec
from meshfeed.storage._paths import expand_paths
from meshfeed.storage._remote import RETRY_S, remote_pool

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
"""The extensions torchvision's ``ImageFolder`` takes, matched without regard to case."""
CATALOG = "meshfeed.images.json"
FORMAT = "meshfeed.images/1"


class ImageFolderSource:
    """Image files as a source: a folder of class subfolders, or files and a label.

    Args:
      root: a folder (a path or a URL) with a subfolder per class, as torchvision's
        ``ImageFolder`` reads it: ``classes`` are the subfolders' names in sorted order,
        an image's ``label`` its class's index there.
      files: instead of ``root``: paths, globs or URLs of image files, in the order given
        (a glob's matches sorted).
      label: with ``files``: ``label(path) -> int`` gives each file's label; without it,
        the source has no ``label`` field.
      extensions: the file names (lower-cased) an image ends with; others are left out.
      catalog: where ``root``'s listing is kept (default ``<root>/meshfeed.images.json``;
        ``False``: list it at every open, keep nothing).
      rebuild_catalog: list ``root`` again, over the catalog there.
      storage_options, retry_s: for URLs, as ``open_source``.

    Fields: ``image`` (each file's bytes, ``uint8[*]``) and ``label`` (``int64``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        files: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
        label: Callable[[str], int] | None = None,
        extensions: Sequence[str] = IMAGE_EXTENSIONS,
        catalog: str | os.PathLike[str] | bool | None = None,
        rebuild_catalog: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        retry_s: float = RETRY_S,
    ) -> None:
        if (root is None) == (files is None):
            raise ValueError(
                "ImageFolderSource takes root= (a folder of class subfolders) or files= "
                "(paths, globs or URLs, with label=), not both and not neither."
            )
        if label is not None and (files is None or not callable(label)):
            raise TypeError(
                "label= is a function of a file's path giving its label, for files=; a "
                "folder's labels come from its subfolders."
            )
        if isinstance(extensions, str) or not all(isinstance(e, str) for e in extensions):
            raise TypeError(f"extensions={extensions!r} must be a list of suffixes ('.jpg', ...).")
        self._extensions = tuple(e.lower() for e in extensions)
        self._options = dict(storage_options or {})
        self._retry_s = retry_s
        self.root: str | None = None
        """The folder, for ``root=``."""
        if root is not None:
            where = os.fspath(root)
            self.root = where.rstrip("/") if is_url(where) else os.path.abspath(where)
            listing = self._open_folder(catalog, rebuild_catalog)
        else:
            listing = list_files(files, label, self._extensions, self._options)
        self.classes: list[str] | None = listing.get("classes")
        """The class names, in label order (``None`` for ``files=``)."""
        self.paths: list[str] = listing["paths"]
        """Each example's file, by id (under ``root`` for a folder)."""
        self._sizes = np.asarray(listing.get("sizes", [-1] * len(self.paths)), np.int64)
        labels = listing.get("labels")
        self._labels = None if labels is None else np.asarray(labels, np.int64)
        self._digest = hashlib.sha256(
            json.dumps([self.paths, self._sizes.tolist()]).encode()
        ).hexdigest()[:16]
        self._remote = bool(self.paths) and is_url(self.path(0))
        fields = {"image": FieldSpec((None,), np.dtype(np.uint8))}
        if self._labels is not None:
            fields["label"] = FieldSpec((), np.dtype(np.int64))
        self._fields = fields

    # -- the listing ------------------------------------------------------------------

    def _open_folder(self, catalog: Any, rebuild: bool) -> dict[str, Any]:
        root = self.root
        assert root is not None
        if catalog is False:
            return list_folder(root, self._extensions, self._options)
        where = join(root, CATALOG) if catalog in (None, True) else os.fspath(catalog)
        if not rebuild:
            try:
                found = read_json(where, self._options)
            except NotADirectoryError:  # where it would go is not a folder: none kept
                found = None
            if found is not None:
                if found.get("format") != FORMAT:
                    raise ValueError(f"{where} is not an image folder's catalog ({FORMAT}).")
                return found
        listing = list_folder(root, self._extensions, self._options)
        try:
            folder, name = where.rsplit("/", 1) if is_url(where) else os.path.split(where)
            FolderWriter(folder, self._options).write(name, json.dumps(listing).encode())
        except OSError as error:  # a read-only data set: list again at every open
            sys.stderr.write(
                f"meshfeed: cannot keep the listing of {root} in {where} ({error}); it is "
                "listed again at every open. Pass ImageFolderSource(catalog=) a writable place.\n"
            )
        return listing

    # -- the source ---------------------------------------------------------------------

    @property
    def fields(self) -> Mapping[str, FieldSpec]:
        """``image`` (a file's bytes) and ``label``."""
        return self._fields

    def __len__(self) -> int:
        """The number of image files."""
        return len(self.paths)

    @property
    def fingerprint(self) -> dict[str, Any]:
        """A digest of the files' paths and sizes, which the loader's state carries."""
        return {"images": self._digest, "count": len(self.paths)}

    @property
    def sizes(self) -> np.ndarray:
        """Each file's size in bytes, by id, as listed (``-1`` where not known: ``files=``)."""
        return self._sizes.copy()

    def path(self, index: int) -> str:
        """The file of example ``index`` (a full path or URL)."""
        rel = self.paths[index]
        return rel if self.root is None else join(self.root, rel)

    def origin(self, index: int) -> str:
        """Where example ``index`` comes from, for messages (``Origins``): its file."""
        return self.path(index)

    def _read(self, index: int) -> bytes:
        blob = Blob(self.path(index), self._options, retry_s=self._retry_s)
        size = int(self._sizes[index])
        return blob.read(0, size) if size >= 0 else blob.read_all()

    def __getitem__(self, ids: np.ndarray | int) -> dict[str, Any]:
        """The images ``ids``: their files' bytes (``Ragged`` ``uint8``) and labels."""
        if isinstance(ids, int | np.integer):
            return example_at(self, ids)
        ids = check_ids(ids, len(self), "this image folder")
        if self._remote:  # every read in flight together
            data = list(remote_pool().map(self._read, ids.tolist()))
        else:
            data = [self._read(int(i)) for i in ids]
        lengths = np.fromiter((len(d) for d in data), np.int64, len(data))
        offsets = np.zeros(len(data) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.frombuffer(b"".join(data), np.uint8) if data else np.zeros(0, np.uint8)
        out: dict[str, Any] = {"image": Ragged(values, offsets)}
        if self._labels is not None:
            out["label"] = self._labels[ids]
        return out

    def __repr__(self) -> str:
        where = self.root if self.root is not None else f"{len(self.paths)} files"
        classes = "" if self.classes is None else f", {len(self.classes)} classes"
        return (
            f"ImageFolderSource({where}: {len(self)} images{classes}; {fields_text(self._fields)})"
        )


def list_folder(
    root: str, extensions: tuple[str, ...], options: Mapping[str, Any]
) -> dict[str, Any]:
    """``root`` listed as torchvision's ``ImageFolder`` lists it (module docstring)."""
    sizes: dict[str, int] = {}
    if is_url(root):
        fs, inner = require_fsspec().core.url_to_fs(root, **options)
        found = fs.find(inner, detail=True)  # one listing (paged) of the whole folder
        prefix = inner.rstrip("/") + "/"
        for path, info in found.items():
            if info.get("type", "file") == "file" and path.startswith(prefix):
                sizes[path[len(prefix) :]] = int(info.get("size") or 0)
        classes = sorted({rel.split("/", 1)[0] for rel in sizes if "/" in rel})
        by_class: dict[str, list[str]] = {c: [] for c in classes}
        for rel in sizes:
            if "/" in rel:
                by_class[rel.split("/", 1)[0]].append(rel)
        # os.walk's order, sorted: by folder, then by name within it.
        for name in classes:
            by_class[name].sort(key=lambda rel: tuple(rel.rsplit("/", 1)))
    else:  # as torchvision: the folders (links followed), each walked in sorted order
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        by_class = {}
        for name in classes:
            top = os.path.join(root, name)
            walked = []
            for folder, _, names in sorted(os.walk(top, followlinks=True)):
                under = os.path.relpath(folder, root).replace(os.sep, "/")
                walked += [f"{under}/{n}" for n in sorted(names)]
            by_class[name] = walked
    paths, labels = [], []
    for index, name in enumerate(classes):
        chosen = [rel for rel in by_class[name] if rel.lower().endswith(extensions)]
        paths += chosen
        labels += [index] * len(chosen)
    kept = {p.split("/", 1)[0] for p in paths}
    empty = [c for c in classes if c not in kept]
    if not classes or empty:
        what = f"the classes {empty[:5]}" if empty else "no class subfolder"
        raise FileNotFoundError(
            f"{root}: {what} with image files ({', '.join(extensions)}); "
            "ImageFolderSource(root) reads root/<class>/<image> (torchvision's layout): "
            "add images or remove the empty folders, or pass files= with label=."
        )
    if not is_url(root):
        sizes = {p: os.stat(os.path.join(root, p)).st_size for p in paths}
    return {
        "format": FORMAT,
        "classes": classes,
        "paths": paths,
        "labels": labels,
        "sizes": [sizes[p] for p in paths],
    }


def list_files(
    files: Any,
    label: Callable[[str], int] | None,
    extensions: tuple[str, ...],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """Image files named by paths, globs or URLs (a glob's matches sorted), with the
    labels ``label`` gives them."""
    named = expand_paths(files, options, what="files")
    paths = [p for p in named if p.lower().endswith(extensions)]
    if not paths:
        raise FileNotFoundError(f"files={files!r} names no image files ({', '.join(extensions)}).")
    listing: dict[str, Any] = {"paths": paths}
    if label is not None:
        labels = [label(p) for p in paths]
        for path, value in zip(paths, labels, strict=True):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(
                    f"label(path) must return an int; it returned {value!r} for {path}."
                )
        listing["labels"] = [int(v) for v in labels]
    return listing
