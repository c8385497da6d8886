"""The data sets the presets train on, fetched from their sources: `attnlab data download NAME`.

Each file comes from a pinned commit of the repository that publishes it and is checked against
its SHA-256 before it is kept. A download goes to `NAME.part` beside the file and is renamed into
place once verified (atomic: a file that is there is complete and correct); an interrupted one
resumes where it stopped (HTTP Range); a file whose checksum does not match is deleted, nothing is
left behind. The checksums are those of the copies in the project's shared data folder, which are
byte-identical to these upstream files (see its README: git blob ids checked where a file had to be
rebuilt there), and for Planetoid those of the upstream files themselves. A data set whose
published files are not what attnlab reads (Planetoid's pickles) is converted once verified
(`DataSet.prepare`). `ELSEWHERE` names the data sets attnlab reads but does not download, and how
to get them.
"""

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from attnlab.errors import UserError

CHUNK = 1 << 16


@dataclass(frozen=True)
class RemoteFile:
    """One file of a data set: where it is published, and what it must be."""

    name: str
    url: str
    sha256: str
    size: int


@dataclass(frozen=True)
class DataSet:
    name: str
    about: str
    licence: str
    """The terms the publishers give (printed before every download)."""
    presets: tuple[str, ...]
    files: tuple[RemoteFile, ...]
    prepare: Callable[[Path, Callable[[str], object]], None] | None = None
    """What turns the verified files in a folder into what attnlab reads, where they differ."""


def _github(repo: str, commit: str, path: str) -> str:
    return f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"


def _files(repo: str, commit: str, prefix: str, sums: dict[str, tuple[str, int]]) -> tuple[RemoteFile, ...]:
    """{name: (sha256, bytes)} of the files at `prefix` in a repository, at a commit."""
    return tuple(RemoteFile(n, _github(repo, commit, prefix + n), s, b) for n, (s, b) in sums.items())


def _multi30k() -> DataSet:
    commit = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
    sums = {
        "train.de.gz": ("726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6", 637044),
        "train.en.gz": ("d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f", 568929),
        "val.de.gz": ("f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a", 24681),
        "val.en.gz": ("14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28", 21650),
        "test_2016_flickr.de.gz": ("9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8", 22890),
        "test_2016_flickr.en.gz": ("611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9", 21077),
        "test_2017_flickr.de.gz": ("a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee", 21471),
        "test_2017_flickr.en.gz": ("76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074", 19138),
    }
    return DataSet(
        "multi30k",
        "Multi30k Task 1, German-English image descriptions (Elliott et al. 2016; test 2017: Elliott et al. 2017)",
        "no licence file; the publishers provide it for non-commercial research and educational use, "
        "images under the Flickr Terms of Use (github.com/multi30k/dataset, 'Use of the data')",
        ("multi30k-de-en", "multi30k-de-en-rnn", "multi30k-de-en-rnn-attention", "multi30k-ablate"),
        _files("multi30k/dataset", commit, "data/task1/raw/", sums),
    )


def _wikitext2() -> DataSet:
    commit = "77f55b912142e11fcfdf5b530231fb9c52f181e8"
    sums = {
        "train.txt": ("9e9fa1ad55b1c2c95b08e37dd8e653f638fac2c6de904b79e813611eefbc985f", 10797148),
        "valid.txt": ("f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8", 1121681),
        "test.txt": ("d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0", 1256449),
    }
    return DataSet(
        "wikitext-2",
        "WikiText-2, tokenized, with <unk> (Merity et al. 2016), as PyTorch's word_language_model ships it",
        "Creative Commons Attribution-ShareAlike (the WikiText authors); cite Merity et al. 2016",
        ("wikitext2-mlm", "wikitext2-electra"),
        _files("pytorch/examples", commit, "word_language_model/data/wikitext-2/", sums),
    )


def _ud_ewt() -> DataSet:
    commit = "15d613d8447b3478787d4c278730a1e48a945efb"
    # Upstream publishes plain CoNLL-U (the shared copy gzipped them; these are the uncompressed sums).
    sums = {
        "en_ewt-ud-train.conllu": ("3fb78e2b55482c8ee00caa653af436c88c9e5bc9a73ce26e4ae3ddc79d2b7e7b", 14203025),
        "en_ewt-ud-dev.conllu": ("531a54ff90d6ab12201c5a50c3e78e6ddac4de69abc4bce5d275d3cd29efe2b6", 1805545),
        "en_ewt-ud-test.conllu": ("e266e515a0a7547657ed3d90d9ba46487d6bd251f27ad4269d4e8a427c8555cd", 1804515),
        "LICENSE.txt": ("b3d1b0f4c6ae151f7eb78738f46ebd5ee140f8a7f76501ba26af123140d35ae7", 20014),
    }
    return DataSet(
        "ud-english-ewt",
        "Universal Dependencies English Web Treebank (CoNLL-U)",
        "CC BY-SA 4.0 (LICENSE.txt, downloaded with the data); parts of the underlying texts may be (c) "
        "Google, Yahoo!, UPenn or their authors",
        ("ud-pos", "ud-pos-bilstm", "ud-mlm", "ud-pos-minilm"),
        _files("UniversalDependencies/UD_English-EWT", commit, "", sums),
    )


def _sst2() -> DataSet:
    # GLUE distributes SST-2 as a zip (dl.fbaipublicfiles.com/glue/data/SST-2.zip) whose checksum this
    # project could not compute (no copy of that archive here, and no network). These are the same
    # rows in GLUE's tsv format from a pinned repository whose files the shared copy is (label
    # counts match the published GLUE figures; see the shared data README).
    commit = "6288fb5bec9c572f2492875ae0111df5b6daed11"
    files = (
        ("train.tsv", "train_full.tsv", "48eac26399f8456935f81dd9e3a745c1430adb6c62e233ccfe22db4a0d15d1d1", 3806081),
        ("dev.tsv", "dev.tsv", "54a9c12c77e402fc14d6a66a506f24d999f596b0176eb777c972cccc2f9cc4b0", 94931),
    )
    return DataSet(
        "sst2",
        "GLUE SST-2, binary sentiment of movie-review sentences (Socher et al. 2013; Wang et al. 2018)",
        "no explicit data licence from the Stanford Sentiment Treebank or GLUE; cite Socher et al. 2013 and GLUE",
        ("sst2", "sst2-bilstm", "sst2-minilm"),
        tuple(
            RemoteFile(n, _github("eyalbd2/Reproducing-AutoPrompt", commit, f"glue_data/SST-2/{src}"), s, b)
            for n, src, s, b in files
        ),
    )


def _tinyshakespeare() -> DataSet:
    url = _github("karpathy/char-rnn", "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e", "data/tinyshakespeare/input.txt")
    sha = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
    return DataSet(
        "tinyshakespeare",
        "Tiny Shakespeare (Karpathy's char-rnn corpus; attnlab ships a copy, this is its source)",
        "the text is Shakespeare (public domain); the char-rnn repository says MIT",
        ("shakespeare-char", "shakespeare-char-cpu", "demo", "finetune-lm"),
        (RemoteFile("input.txt", url, sha, 1115394),),
    )


def _fashion_mnist() -> DataSet:
    # Zalando's own download location (the repository's README links it); the files are those of
    # zalandoresearch/fashion-mnist data/fashion/, which the shared copy holds unchanged.
    base = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
    sums = {
        "train-images-idx3-ubyte.gz": ("b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7", 26421856),
        "train-labels-idx1-ubyte.gz": ("0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056", 29491),
        "t10k-images-idx3-ubyte.gz": ("cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa", 4422079),
        "t10k-labels-idx1-ubyte.gz": ("8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05", 5125),
    }
    return DataSet(
        "fashion-mnist",
        "Fashion-MNIST, 28x28 grey images of 10 kinds of clothing (Xiao, Rasul & Vollgraf 2017), IDX, gzip",
        "MIT, Copyright 2017 Zalando SE",
        (
            "fashion-pixelcnn",
            "fashion-gated-pixelcnn",
            "fashion-igpt",
            "fashion-vit",
            "fashion-vit-hybrid",
            "fashion-cnn",
        ),
        tuple(RemoteFile(n, base + n, sha, size) for n, (sha, size) in sums.items()),
    )


def _planetoid() -> DataSet:
    # Upstream publishes Python pickles; `attnlab.data.planetoid` reads them with an unpickler that
    # admits only the numpy/CSR/dict types they hold, and writes cora/ and citeseer/ as attnlab
    # reads them. The sums are those of the files at this commit (whose conversion gives the shared
    # copy's arrays exactly). PubMed, also published there, has no preset and is not fetched.
    commit = "af6abf468a772cc055bec88c52e4d6f51b7c37e3"
    sums = {
        "ind.cora.x": ("23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab", 22119),
        "ind.cora.y": ("94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1", 4054),
        "ind.cora.tx": ("b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a", 148025),
        "ind.cora.ty": ("41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad", 28135),
        "ind.cora.allx": ("9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543", 257305),
        "ind.cora.ally": ("2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71", 47959),
        "ind.cora.graph": ("58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d", 59847),
        "ind.cora.test.index": ("297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875", 5000),
        "ind.citeseer.x": ("d20de19150741e555de0ed037195630fc194114ebc7fd72ced62810148aa22f6", 31087),
        "ind.citeseer.y": ("8ba87e515d8e3ee3cf52f6d2c5b86aa73f11ecad825a808455209ec26cd54924", 3014),
        "ind.citeseer.tx": ("539a8906a2da97628d212f2fdd668c109a8b3f0d36574b59e5d3fd5b5303da21", 260321),
        "ind.citeseer.ty": ("55e5bd1ba1e733a04598753ad1a8d57957f4b8f89e74519f41f4f4938767e4ce", 24135),
        "ind.citeseer.allx": ("2ac30345d95c9ec933a817ee0bdd6a5f077f8c184a20e696910192d534414668", 595021),
        "ind.citeseer.ally": ("f704b2d986dde6c2669934de1f3ae5696a6cf9455c0f6b2646a2d135ea0a1c95", 55623),
        "ind.citeseer.graph": ("d79a4ef9d3e7169aee8946145f6b7306e35bc79bffad26346cfb94e10e9912a7", 61987),
        "ind.citeseer.test.index": ("2af990671580b6b2df5d158d1038f8292e30c9cd821b5453f399659b25b723d4", 5000),
    }
    return DataSet(
        "planetoid",
        "the Cora and Citeseer citation graphs with the Planetoid public split (Sen et al. 2008; Yang, "
        "Cohen & Salakhutdinov 2016), converted into cora/ and citeseer/",
        "MIT, Copyright 2016 Zhilin Yang (kimiyoung/planetoid); cite Sen et al. 2008 and Yang et al. 2016",
        ("cora-gat", "cora-gcn", "cora-transformer", "cora-transformer-masked", "citeseer-gat"),
        _files("kimiyoung/planetoid", commit, "data/", sums),
        prepare=_convert_planetoid,
    )


def _convert_planetoid(folder: Path, say: Callable[[str], object]) -> None:
    from attnlab.data.planetoid import convert

    for name in ("cora", "citeseer"):
        say(f"{convert(folder, name, folder)}: converted from the ind.{name}.* files, read back checked")


@dataclass(frozen=True)
class Elsewhere:
    """A data set attnlab reads but does not download, and how to get it."""

    name: str
    about: str
    licence: str
    presets: tuple[str, ...]
    how: str


# The Free Spoken Digit Dataset is 3,000 WAV files in a git repository, which `git clone` fetches
# better than 3,000 pinned downloads.
ELSEWHERE = {
    "fsdd": Elsewhere(
        "fsdd",
        "the Free Spoken Digit Dataset, 3,000 recordings of the digits 0-9 by 6 speakers, WAV, 8 kHz",
        "CC BY-SA 4.0 (the repository's README)",
        ("fsdd-digits", "fsdd-wavenet"),
        "git clone https://github.com/Jakobovski/free-spoken-digit-dataset and pass its recordings/ "
        "as --data-dir (the shared copy is commit 26eb9aa)",
    ),
    "conversations": Elsewhere(
        "conversations",
        'conversations in OpenAI\'s fine-tuning JSONL, one {"messages": [...]} a line: your own',
        "yours",
        ("chat-sft",),
        "write them into a folder as train.jsonl (and val.jsonl) and pass it as --data-dir, or give one "
        'file with --set data.path="FILE.jsonl"',
    ),
    "chat-mix": Elsewhere(
        "chat-mix",
        "an instruction mix of Multi30k, SST-2, UD English EWT, Tiny Shakespeare and arithmetic word problems, "
        "in OpenAI's fine-tuning JSONL, with its training texts to pretrain on",
        "those of the data sets it is written from",
        ("chat-mix-pretrain", "chat-mix-sft"),
        "attnlab data chat-mix --data-dir DIR (DIR holding multi30k/, sst2/, ud-english-ewt/ as attnlab data "
        "download writes them) writes it to data/chat-mix",
    ),
}
ALIASES = {"cora": "planetoid", "citeseer": "planetoid"}
DATASETS = {
    d.name: d
    for d in (_multi30k(), _wikitext2(), _ud_ewt(), _sst2(), _tinyshakespeare(), _fashion_mnist(), _planetoid())
}


def find(name: str) -> DataSet:
    from attnlab.config import close_matches

    if name in ELSEWHERE:
        raise UserError(f"attnlab does not download {name}: {ELSEWHERE[name].how}")
    if name.lower() in ALIASES:
        whole = ALIASES[name.lower()]
        raise UserError(f"{name} is part of data set {whole!r}: attnlab data download {whole}")
    if name not in DATASETS:
        raise UserError(
            f"unknown data set {name!r}{close_matches(name, DATASETS)}; data sets are {', '.join(DATASETS)}"
        )
    return DATASETS[name]


def fetch(file: RemoteFile, folder: Path, *, url: str | None = None, say: Callable[[str], object] = print) -> bool:
    """Download `file` into `folder` (from `url` instead of its own where given, e.g. a mirror),
    verified; returns False when a verified copy was there already. A `.part` file left by an
    interrupted download is continued with an HTTP Range request; a checksum mismatch deletes it
    and raises `UserError`."""
    dest, part = folder / file.name, folder / f"{file.name}.part"
    if dest.is_file() and _sha256(dest) == file.sha256:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    offset = part.stat().st_size if part.is_file() else 0
    source = url or file.url
    if offset < file.size:
        request = urllib.request.Request(source, headers={"Range": f"bytes={offset}-"} if offset else {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                if offset and response.status != 206:  # the server sent the whole file: start over
                    say(f"{file.name}: the server cannot resume; downloading it again")
                    offset = 0
                elif offset:
                    say(f"{file.name}: resuming at byte {offset:,} of {file.size:,}")
                with open(part, "ab" if offset else "wb") as f:
                    while chunk := response.read(CHUNK):
                        f.write(chunk)
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise UserError(
                f"cannot download {source}: {reason}; run the command again to resume ({part} is kept)"
            ) from None
    got = _sha256(part)
    if got != file.sha256:
        part.unlink()
        raise UserError(
            f"{file.name} from {source} has SHA-256 {got}, not the published {file.sha256}; deleted it, "
            "nothing was kept (a changed or damaged file: try again, or another --mirror)"
        )
    os.replace(part, dest)
    return True


def download(name: str, folder: Path, *, mirror: str | None = None, say: Callable[[str], object] = print) -> DataSet:
    """Every file of data set `name` into `folder`, verified (see `fetch`). mirror: a base URL
    that serves the same files by name (`MIRROR/train.de.gz`) instead of their sources."""
    data = find(name)
    say(f"{data.name}: {data.about}")
    say(f"licence: {data.licence}")
    for file in data.files:
        url = f"{mirror.rstrip('/')}/{file.name}" if mirror else None
        fetched = fetch(file, folder, url=url, say=say)
        say(f"{folder / file.name}: {'downloaded' if fetched else 'already there'}, SHA-256 verified")
    if data.prepare is not None:
        data.prepare(folder, say)
    return data


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
