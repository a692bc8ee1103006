#!/bin/sh
# Stop the background capturer gracefully (it writes a final checkpoint);
# sh stop.sh --agent stops the region agent started by sh start.sh --agent,
# sh stop.sh --apply the applier started by sh start.sh --apply.
ROOT=$(cd "$(dirname "$0")" && pwd)
PIDFILE="$ROOT/log/capturer.pid"
WHAT=capturer
if [ "${1:-}" = "--agent" ]; then PIDFILE="$ROOT/log/agent.pid"; WHAT=agent; fi
if [ "${1:-}" = "--apply" ]; then PIDFILE="$ROOT/log/apply.pid"; WHAT=applier; fi
if [ ! -f "$PIDFILE" ]; then echo "stop.sh: not running (no $PIDFILE)"; exit 0; fi
PID=$(cat "$PIDFILE")
if ! kill -0 "$PID" 2>/dev/null; then echo "stop.sh: not running (stale pid $PID)"; rm -f "$PIDFILE"; exit 0; fi
kill -TERM "$PID"
i=0
while kill -0 "$PID" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 120 ]; then echo "stop.sh: pid $PID still running after 60s" >&2; exit 1; fi
    sleep 0.5
done
rm -f "$PIDFILE"
echo "$WHAT stopped"
