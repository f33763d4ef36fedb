"""Choosing the ``tf.distribute`` strategy: a TPU, several GPUs, a cluster of
workers described by ``TF_CONFIG``, or the default (one device).

>>> import keras_vit.train as kt
>>> s = kt.strategy("default")
>>> s.num_replicas_in_sync
1
>>> kt.describe(s)["name"]
'default'
"""

from __future__ import annotations

import glob
import json
import socket
import threading
import warnings

from keras_vit.base import environment
from keras_vit.base.checks import check_choice, check_int, check_type
from keras_vit.base.errors import KerasVitError
from keras_vit.base.limits import MAX_CPU_DEVICES

NAMES = ("auto", "default", "one_device", "mirrored", "multi_worker", "tpu")

# Seconds to wait for a TPU; a wrong address otherwise hangs for minutes.
TPU_TIMEOUT = 20.0


class StrategyError(KerasVitError, ValueError):
    """The requested strategy cannot be built on this machine."""


def configure_cpu_devices(count):
    """Splits the host CPU into ``count`` logical devices, for several
    replicas without GPUs (TensorFlow or JAX; torch refuses ``count`` above
    1). It must run before the backend initialises its devices; afterwards
    this raises.

    >>> configure_cpu_devices(1)  # the default: a no-op once TF is running
    """
    from keras_vit.runtime.backend import name as backend_name

    check_int("cpu_devices", count, low=1, high=MAX_CPU_DEVICES,
              error=StrategyError)
    backend = backend_name()
    too_late = (
        f"cpu_devices={count} must be configured before the {backend!r} "
        "backend initialises its devices (before any tensor is created); "
        "call keras_vit.train.configure_cpu_devices first in the program, "
        "or pass --cpu-devices on the command line.")
    if backend == "jax":
        import jax

        try:
            jax.config.update("jax_num_cpu_devices", count)
        except RuntimeError as e:  # JAX has made its devices already
            if len(jax.devices("cpu")) == count:
                return
            raise StrategyError(f"{too_late} JAX said: {e}") from None
        return
    if backend != "tensorflow":
        if count == 1:
            return
        raise StrategyError(
            f"cpu_devices={count} splits the CPU for several replicas, but "
            f"the {backend!r} Keras backend trains on one device; set "
            "KERAS_BACKEND=jax (strategy 'data_parallel') or =tensorflow "
            "(strategy 'mirrored') to run replicas on CPU devices.")
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    current = tf.config.get_logical_device_configuration(cpus[0])
    if len(current or [None]) == count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count)
    except RuntimeError as e:
        if len(tf.config.list_logical_devices("CPU")) == count:
            return
        raise StrategyError(f"{too_late} TensorFlow said: {e}") from None


def cluster_from_env():
    """The cluster ``TF_CONFIG`` describes, as ``(cluster, task)``, or None.
    A malformed ``TF_CONFIG`` raises."""
    raw = environment.tf_config()
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise StrategyError(
            f"TF_CONFIG is not valid JSON ({e}); received TF_CONFIG={raw!r}"
        ) from None
    cluster = config.get("cluster") or {}
    if not isinstance(cluster, dict) or not cluster:
        return None
    task = config.get("task") or {}
    if "type" not in task or "index" not in task:
        raise StrategyError(
            "TF_CONFIG describes a cluster but not this process's task "
            '(need "task": {"type": "worker", "index": N}); received '
            f"TF_CONFIG={raw!r}")
    return cluster, task


def _cluster_size(cluster):
    return sum(len(v) for k, v in cluster.items() if k in ("chief", "worker"))


def _with_timeout(fn, timeout, what):
    """Runs ``fn()`` in a daemon thread; raises TimeoutError after
    ``timeout`` seconds (the thread is left behind, it cannot be killed)."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=what)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _check_address(tpu, timeout):
    """Fails fast on a ``grpc://host:port`` that does not accept connections
    (TensorFlow would wait on it for minutes)."""
    if not (isinstance(tpu, str) and tpu.startswith("grpc://")):
        return
    host, _, port = tpu[len("grpc://"):].rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as e:
        raise StrategyError(
            f"strategy='tpu' but no TPU answers at tpu={tpu!r}: {e}"
        ) from None


# The device files a TPU VM's chips appear as: /dev/accel<N> (TPU v2-v4),
# /dev/vfio/<N> (v5e and later).
TPU_DEVICE_FILES = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")

# Variables through which TensorFlow's resolver finds a TPU elsewhere.
TPU_ENVIRONMENT = ("KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS", "TPU_CONFIG")


def attached_tpu():
    """True when TPU chips are attached to this machine (a TPU VM).

    >>> isinstance(attached_tpu(), bool)
    True
    """
    return any(glob.glob(pattern) for pattern in TPU_DEVICE_FILES)


def tpu_address(tpu=None):
    """What TensorFlow's ``TPUClusterResolver`` is given for ``tpu``: the
    name or address itself; ``"local"`` when none is given and this machine
    has TPU chips; None when the environment names a TPU. Otherwise a
    :class:`StrategyError`, at once."""
    if tpu is not None:
        check_type("tpu", tpu, str, "a TPU name, 'local' or grpc://host:port")
        if tpu.strip():
            return tpu
    if environment.any_set(TPU_ENVIRONMENT):
        return None
    if attached_tpu():
        return "local"
    raise StrategyError(
        "strategy='tpu' but no TPU was found: none is attached to this "
        f"machine (no {' or '.join(TPU_DEVICE_FILES)}) and no tpu= (--tpu) "
        "or TPU_NAME names one elsewhere; on a TPU VM the TPU is found "
        "without either, for a TPU node pass tpu=NAME or "
        "tpu='grpc://HOST:8470'.")


def _first_sentence(error, limit=240):
    """``error``'s text on one line, cut after its first sentence."""
    text = " ".join(str(error).split()) or type(error).__name__
    end = text.find(". ")
    text = text if end < 0 else text[:end + 1]
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " ..."
    return text


def _tpu_failure(tpu, error):
    """The one line saying why the TPU ``tpu`` did not start."""
    where = f"strategy='tpu' with tpu={tpu!r}"
    if tpu == "local" and not attached_tpu():
        return (f"{where}, but no TPU is attached to this machine (no "
                f"{' or '.join(TPU_DEVICE_FILES)}); for a TPU elsewhere "
                "pass its name or grpc://HOST:8470.")
    text = str(error)
    if "ConfigureDistributedTPU" in text and "OpKernel" in text:
        import tensorflow as tf

        return (f"{where}: this TensorFlow ({tf.__version__}) has no TPU "
                "support; install TensorFlow's TPU build (tensorflow-tpu) "
                "on the TPU VM, or train under KERAS_BACKEND=jax with "
                "jax[tpu].")
    named = tpu not in (None, "local") and not tpu.startswith("grpc://")
    if (named and isinstance(error, OSError)
            and not isinstance(error, TimeoutError)):
        # TensorFlow looks a name up on Google Cloud's metadata server.
        return (f"{where}: looking the name up needs Google Cloud's "
                "metadata server, which did not answer "
                f"({_first_sentence(error)}); pass the TPU's address "
                "instead, tpu='grpc://HOST:8470'.")
    return f"{where} did not start: {_first_sentence(error)}"


def _tpu_strategy(tpu, timeout):
    """A ``TPUStrategy`` on ``tpu`` (from :func:`tpu_address`), or a
    :class:`StrategyError` in one line saying why not."""
    import tensorflow as tf

    _check_address(tpu, min(timeout, 5.0))

    def connect():
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
        if tpu not in (None, "", "local"):
            tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return resolver

    try:
        resolver = _with_timeout(connect, timeout, "TPU initialisation")
    except Exception as e:  # noqa: BLE001 - every cause ends the same way
        raise StrategyError(_tpu_failure(tpu, e)) from None
    return tf.distribute.TPUStrategy(resolver)


# What each backend other than TensorFlow can run.
KERAS_STRATEGIES = {"jax": ("auto", "default", "data_parallel"),
                    "torch": ("auto", "default")}


def check_backend(name):
    """Refuses a strategy the current Keras backend cannot run, saying
    what to do instead.

    >>> check_backend("auto")
    """
    from keras_vit.runtime.backend import name as backend_name

    backend = backend_name()
    key = name.replace("-", "_") if isinstance(name, str) else None
    if isinstance(name, str) and key not in NAMES + ("data_parallel",):
        check_choice("strategy", name, NAMES + ("data_parallel",),
                     error=StrategyError)
    known = KERAS_STRATEGIES.get(backend)
    if known is None:  # TensorFlow: every tf.distribute name
        if key == "data_parallel":
            raise StrategyError(
                f"strategy={name!r} (keras.distribution.DataParallel) runs "
                "on the 'jax' Keras backend; under 'tensorflow' use "
                "strategy='mirrored' (tf.distribute, every GPU) or 'auto', "
                "or set KERAS_BACKEND=jax.")
        return
    if key in known:
        return
    if key == "data_parallel":
        raise StrategyError(
            f"strategy={name!r} (keras.distribution.DataParallel) runs on "
            f"the 'jax' Keras backend; under {backend!r} use "
            "strategy='default' (one device), or set KERAS_BACKEND=jax "
            "(or tensorflow with strategy='mirrored').")
    if key == "tpu" and backend == "jax":
        raise StrategyError(
            f"strategy={name!r} is a tf.distribute strategy, which the 'jax' "
            f"Keras backend cannot run, and {_jax_tpus()}; under jax a TPU "
            "trains with strategy='data_parallel' (keras.distribution over "
            "every TPU core; 'auto' picks it), or set "
            "KERAS_BACKEND=tensorflow for TPUStrategy.")
    raise StrategyError(
        f"strategy={name!r} is a tf.distribute strategy, which the "
        f"{backend!r} Keras backend cannot run; use strategy='default' "
        f"(one device) under {backend}"
        + (" or 'data_parallel' (keras.distribution)" if backend == "jax"
           else "")
        + ", or set KERAS_BACKEND=tensorflow to "
        "train with tf.distribute (mirrored, multi_worker, tpu).")


def _jax_tpus():
    """What JAX sees, in words: its TPU cores, or that it sees none."""
    import jax

    devices = jax.devices()
    tpus = [d for d in devices if d.platform == "tpu"]
    if tpus:
        return f"JAX sees {len(tpus)} TPU devices"
    kinds = sorted({d.platform for d in devices})
    return (f"JAX sees no TPU here ({len(devices)} {'/'.join(kinds)} "
            f"device{'s' if len(devices) > 1 else ''})")


def for_backend(name="auto", *, tpu=None):
    """The strategy to hand to several runs on the current Keras backend:
    under TensorFlow the ``tf.distribute.Strategy`` (so a TPU is
    initialised once), under jax and torch the checked name.

    >>> for_backend("default") is not None
    True
    """
    from keras_vit.runtime.backend import is_tensorflow

    check_backend(name)
    if not is_tensorflow():
        return name
    return strategy(name, tpu=tpu)


def strategy(name="auto", *, tpu=None, devices=None, timeout=TPU_TIMEOUT):
    """Builds a ``tf.distribute.Strategy``.

    Args:
        name: ``"auto"`` picks, in order: ``multi_worker`` when ``TF_CONFIG``
            describes a cluster of several workers, ``tpu`` when a TPU is
            reachable, ``mirrored`` when there are several GPUs, else
            ``default``. Or one of ``"default"`` (no distribution),
            ``"one_device"``, ``"mirrored"`` (all GPUs, or all logical CPUs
            without GPUs, see :func:`configure_cpu_devices`),
            ``"multi_worker"`` (``TF_CONFIG`` gives the cluster), ``"tpu"``.
            A ``tf.distribute.Strategy`` is returned as is.
        tpu: a TPU name, ``grpc://host:port`` or ``"local"`` (default:
            ``TPU_NAME``, else the TPU attached to this machine).
        devices: device names for ``mirrored`` / ``one_device``.
        timeout: seconds to wait for a TPU before giving up.

    Raises:
        StrategyError: an unknown name, or an explicit ``"tpu"`` with no
            TPU or one that did not start.
    """
    import tensorflow as tf

    if isinstance(name, tf.distribute.Strategy):
        return name
    if not isinstance(name, str) or name.replace("-", "_") not in NAMES:
        check_choice("strategy", name, NAMES, error=StrategyError,
                     extra=" (A tf.distribute.Strategy also works.)")
    name = name.replace("-", "_")
    if tpu is None:
        tpu = environment.tpu_name()

    if name == "auto":
        cluster = cluster_from_env()
        if cluster and _cluster_size(cluster[0]) > 1:
            name = "multi_worker"
        else:
            try:
                address = tpu_address(tpu)
            except StrategyError:
                pass
            else:
                try:
                    return _tpu_strategy(address, timeout)
                except StrategyError as e:
                    warnings.warn(f"strategy='auto' trains without the "
                                  f"TPU: {e}", stacklevel=2)
            gpus = tf.config.list_logical_devices("GPU")
            name = "mirrored" if len(gpus) > 1 else "default"

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "one_device":
        device = (devices or [None])[0]
        if device is None:
            device = ("/gpu:0" if tf.config.list_logical_devices("GPU")
                      else "/cpu:0")
        return tf.distribute.OneDeviceStrategy(device)
    if name == "mirrored":
        if devices is None:
            found = (tf.config.list_logical_devices("GPU")
                     or tf.config.list_logical_devices("CPU"))
            devices = [d.name for d in found]
        return tf.distribute.MirroredStrategy(list(devices))
    if name == "multi_worker":
        if cluster_from_env() is None:
            warnings.warn(
                "strategy='multi_worker' without a TF_CONFIG cluster runs as "
                "a single worker; set TF_CONFIG on every worker to train on "
                "several machines.", stacklevel=2)
        return tf.distribute.MultiWorkerMirroredStrategy()
    return _tpu_strategy(tpu_address(tpu), timeout)


def step_uses_xla(strategy_, requested="auto", precision="float32"):
    """Whether the train step compiles with XLA. ``requested`` True or
    False is taken as it is; ``"auto"`` follows
    :func:`keras_vit.runtime.hardware.plan` for one replica and stays off
    for several replicas and the TPU (which compiles the whole step
    anyway)."""
    if requested in (True, False):
        return requested
    from keras_vit.runtime import hardware

    info = describe(strategy_)
    if info["name"] == "tpu" or strategy_.num_replicas_in_sync != 1:
        return False
    return hardware.plan(precision).train_jit


def describe(strategy_):
    """Name, replica count, workers and whether this process is the chief
    (the one that writes checkpoints, logs and the final model)."""
    import tensorflow as tf

    check_type("strategy_", strategy_, tf.distribute.Strategy,
               "a tf.distribute.Strategy")

    kind = type(strategy_).__name__
    names = {"MirroredStrategy": "mirrored", "OneDeviceStrategy": "one_device",
             "CollectiveAllReduceStrategy": "multi_worker",
             "MultiWorkerMirroredStrategy": "multi_worker",
             "TPUStrategy": "tpu", "TPUStrategyV2": "tpu"}
    name = names.get(kind, "default")
    if not tf.distribute.has_strategy() and strategy_ is (
            tf.distribute.get_strategy()):
        name = "default"
    task_type, task_id, workers, spec = None, 0, 1, {}
    resolver = getattr(strategy_, "cluster_resolver", None)
    if name == "multi_worker" and resolver is not None:
        task_type, task_id = resolver.task_type, resolver.task_id
        spec = resolver.cluster_spec().as_dict()
        workers = max(1, _cluster_size(spec))
    is_chief = task_type in (None, "chief") or (
        task_type == "worker" and "chief" not in spec and int(task_id) == 0)
    return {
        "name": name,
        "class": kind,
        "replicas": int(strategy_.num_replicas_in_sync),
        "workers": workers,
        "task_type": task_type,
        "task_id": int(task_id or 0),
        "is_chief": is_chief,
    }


PRECISIONS = ("auto", "float32", "mixed_bfloat16")


def check_precision_name(requested):
    """``requested`` if it is one of :data:`PRECISIONS`, else a ValueError
    naming ``precision``."""
    return check_choice("precision", requested, PRECISIONS)


def check_precision(requested="auto", *, on_tpu=False):
    """A run's Keras dtype policy name: ``"float32"``,
    ``"mixed_bfloat16"``, or ``"auto"``: bfloat16 on a TPU, float32
    elsewhere.

    ``"auto"`` does not pick bfloat16 on CPUs with native support: a
    ViT-S/16 training step at 224 took 5.9 s in mixed_bfloat16 against
    3.7 s in float32 (2 cores, TF 2.21). Without native support it is
    emulated and slower still, so that case warns.

    >>> check_precision("auto"), check_precision("auto", on_tpu=True)
    ('float32', 'mixed_bfloat16')
    """
    check_precision_name(requested)
    if requested == "auto":
        return "mixed_bfloat16" if on_tpu else "float32"
    if requested == "mixed_bfloat16" and not on_tpu:
        from keras_vit.runtime import hardware

        if hardware.detect().accelerator == "cpu" and not cpu_has_bf16():
            warnings.warn(
                "precision='mixed_bfloat16' on a CPU without native bfloat16 "
                "(no avx512_bf16 / amx_bf16 flag): it is emulated and slower "
                "than float32.", stacklevel=3)
    return requested


def cpu_has_bf16():
    """True when the CPU advertises native bfloat16 (flags ``avx512_bf16``
    or ``amx_bf16``)."""
    from keras_vit.runtime import hardware

    return hardware.Hardware(cpu_flags=hardware.cpu_flags()).bf16_units \
        is not None
