#!/usr/bin/env python3
"""Check that the images `./kiln-dev images` built have the layout the Containerfiles declare.

Usage:
  e2e/images/check-containerfiles.py IMAGES_DIR [SOURCE_ROOT]

For each of operator, store and agent, reads SOURCE_ROOT/<component>/Containerfile (default:
this checkout) and IMAGES_DIR/kiln-<component>.tar, and compares the Containerfile's final
stage with the archive's image config and layer:
  - the image name in the Containerfile's `-t` build comment equals the archive's name;
  - USER, WORKDIR, ENTRYPOINT and CMD equal the config's User, WorkingDir, Entrypoint, Cmd;
  - EXPOSE lists exactly the config's ExposedPorts;
  - every ENV is in the config's Env with the same value, and the config sets nothing else
    but what the distroless base image sets (PATH, SSL_CERT_FILE);
  - every COPY destination is in the layer, owned by its --chown (else root).
Prints each mismatch and exits 1 if there is any.
"""

import io
import json
import os
import re
import shlex
import sys
import tarfile

COMPONENTS = ("operator", "store", "agent")
# What gcr.io/distroless/cc-debian12 sets, which the Containerfiles inherit.
BASE_ENV = {"PATH", "SSL_CERT_FILE"}


def instructions(text):
    """(KEYWORD, arguments) of each instruction, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        found.append((keyword.upper(), rest.strip()))
    return found


def final_stage(path):
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    parsed = instructions(text)
    starts = [i for i, (keyword, _) in enumerate(parsed) if keyword == "FROM"]
    if not starts:
        raise ValueError(f"{path}: no FROM")
    tag = re.search(r"-t\s+(\S+)", text)
    stage = {"name": tag.group(1) if tag else None, "env": {}, "expose": set(), "copies": []}
    for keyword, rest in parsed[starts[-1] + 1:]:
        if keyword == "USER":
            stage["user"] = rest
        elif keyword == "WORKDIR":
            stage["workdir"] = rest
        elif keyword in ("ENTRYPOINT", "CMD"):
            stage[keyword.lower()] = json.loads(rest)
        elif keyword == "EXPOSE":
            stage["expose"].update(p if "/" in p else p + "/tcp" for p in rest.split())
        elif keyword == "ENV":
            for item in shlex.split(rest):
                key, sep, value = item.partition("=")
                if not sep:
                    raise ValueError(f"{path}: ENV {rest!r}: use KEY=VALUE")
                stage["env"][key] = value
        elif keyword == "COPY":
            words = rest.split()
            flags = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            chown = next((f.split("=", 1)[1] for f in flags if f.startswith("--chown=")), "0:0")
            stage["copies"].append((paths[-1], chown))
    return stage


def read_image(archive_path):
    with tarfile.open(archive_path) as archive:
        def blob(digest):
            member = archive.extractfile("blobs/sha256/" + digest.split(":", 1)[1])
            return member.read()
        index = json.loads(archive.extractfile("index.json").read())
        entry = index["manifests"][0]
        manifest = json.loads(blob(entry["digest"]))
        config = json.loads(blob(manifest["config"]["digest"]))
        layer_bytes = blob(manifest["layers"][0]["digest"])
    owners = {}
    with tarfile.open(fileobj=io.BytesIO(layer_bytes), mode="r:*") as layer:
        for member in layer.getmembers():
            owners["/" + member.name.removeprefix("./").rstrip("/")] = f"{member.uid}:{member.gid}"
    name = entry.get("annotations", {}).get("io.containerd.image.name")
    return name, config.get("config", {}), owners


def compare(component, stage, name, config, owners):
    problems = []

    def expect(what, declared, built):
        if declared != built:
            problems.append(f"{what}: Containerfile {declared!r}, image {built!r}")

    expect("image name", stage["name"], name)
    expect("USER", stage.get("user"), config.get("User"))
    expect("WORKDIR", stage.get("workdir"), config.get("WorkingDir"))
    expect("ENTRYPOINT", stage.get("entrypoint"), config.get("Entrypoint"))
    expect("CMD", stage.get("cmd"), config.get("Cmd"))
    expect("EXPOSE", sorted(stage["expose"]), sorted(config.get("ExposedPorts", {})))
    env = dict(item.split("=", 1) for item in config.get("Env", []))
    for key, value in stage["env"].items():
        expect(f"ENV {key}", value, env.get(key))
    for key in sorted(set(env) - set(stage["env"]) - BASE_ENV):
        problems.append(f"ENV {key}: set in the image ({env[key]!r}), not in the Containerfile")
    for destination, chown in stage["copies"]:
        path = "/" + destination.strip("/")
        if path not in owners:
            problems.append(f"COPY {destination}: not in the image")
        else:
            expect(f"owner of {path}", chown, owners[path])
    return [f"{component}: {problem}" for problem in problems]


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    images_dir = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) == 3 else os.path.join(os.path.dirname(__file__), "..", "..")
    problems = []
    for component in COMPONENTS:
        try:
            stage = final_stage(os.path.join(root, component, "Containerfile"))
            name, config, owners = read_image(os.path.join(images_dir, f"kiln-{component}.tar"))
        except (OSError, ValueError, KeyError, tarfile.TarError) as err:
            problems.append(f"{component}: {err}")
            continue
        problems.extend(compare(component, stage, name, config, owners))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 1
    print(f"images in {images_dir} match the Containerfiles ({', '.join(COMPONENTS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
