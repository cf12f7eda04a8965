# Sourced by the shell scripts under benchmarks/: their header comment is their usage text, so
# `-h` / `--help` prints it and exits 0 before the script builds, downloads or writes anything.

# print_usage SCRIPT: the comment block under SCRIPT's shebang, without the comment marks
print_usage() {
    awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$1"
}

# help_if_asked SCRIPT ARGS...: print SCRIPT's usage and exit 0 when ARGS hold -h or --help
help_if_asked() {
    local script="$1" a
    shift
    for a in "$@"; do
        case "$a" in
            -h|--help) print_usage "$script"; exit 0 ;;
        esac
    done
}
