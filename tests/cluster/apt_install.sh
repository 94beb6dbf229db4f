# Sourced by the local daemons' scripts: install_missing STATE PACKAGE... installs the Debian
# packages not yet installed (apt-get update only when the first try fails); the log goes to
# STATE/apt.log. Needs the caller's say and die.
install_missing() {
    local state=$1 missing=()
    shift
    for package in "$@"; do
        dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    [ "$(id -u)" = 0 ] || die "installing ${missing[*]} needs root"
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "${missing[@]}" >"$state/apt.log" 2>&1 \
        || { apt-get update -q >>"$state/apt.log" 2>&1 && apt-get install -y -q "${missing[@]}" >>"$state/apt.log" 2>&1; } \
        || die "apt-get install ${missing[*]} failed (see $state/apt.log)"
}
