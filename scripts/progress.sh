# shellcheck shell=bash
# progress TOTAL reads `go build -v` on stdin: it counts the packages as Go
# names them, prints the count out of TOTAL (the most the build compiles)
# with the time elapsed at least every 10 seconds, also while Go prints
# nothing (a long package, the link), and passes any other line (an error)
# through as it comes. On a terminal the count is one line kept up to date.
# Sourced by build.sh and tool-build.sh.
progress() {
  local total=$1 n=0 start=$SECONDS last=$SECONDS line partial="" tty=0
  [ -t 1 ] && tty=1
  while :; do
    if IFS= read -r -t 1 line; then
      line=$partial$line
      partial=""
      case $line in
        *' '* | '#'* | '')
          ((tty)) && printf '\n'
          printf '%s\n' "$line"
          ;;
        *) n=$((n + 1)) ;;
      esac
    elif (($? > 128)); then
      partial=$partial$line # timed out mid-line: the rest comes later
    else
      line=$partial$line
      [ -n "$line" ] && printf '%s\n' "$line"
      break
    fi
    if ((tty)); then
      printf '\r  compiled %d of at most %d packages, %ds' "$n" "$total" $((SECONDS - start))
    elif ((SECONDS - last >= 10)); then
      printf '  compiled %d of at most %d packages, %ds\n' "$n" "$total" $((SECONDS - start))
      last=$SECONDS
    fi
  done
  ((tty)) && printf '\n'
  printf '  compiled %d packages in %ds (the rest were in the build cache)\n' "$n" $((SECONDS - start))
}
