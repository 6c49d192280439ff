# The bash context's process: one persistent shell that runs every request in itself, so `cd`,
# variables and exports persist between runs. Run as `bash --noprofile --norc THIS CMD_FD EVENT_FD`.
#
# A request is a header line `ID LINES` and LINES lines of shell text that the daemon built
# (the user's code as a quoted here-document sourced with `.`, env assignments before it).
# Sourcing matters: SIGINT's trap `return`s from the sourced code, which stops a run (even a
# pure-bash loop) and leaves the shell and its state alive. Events are JSON lines on fd 4.
eval "exec 3<&$1 4>&$2 $1<&- $2>&-"
trap 'return 130 2>/dev/null' INT
__sc_count=0
printf '{"type":"ready","id":0}\n' >&4
while :; do
    IFS=' ' read -r -u 3 __sc_id __sc_lines || { (($? > 128)) && continue; exit 0; }
    mapfile -t -n "$__sc_lines" -u 3 __sc_text
    printf -v __sc_request '%s\n' "${__sc_text[@]}"
    __sc_count=$((__sc_count + 1))
    eval "$__sc_request" 3<&- 4>&-
    __sc_status=$?
    printf '{"type":"done","id":%d,"status":%d,"execution_count":%d}\n' \
        "$__sc_id" "$__sc_status" "$__sc_count" >&4
done
