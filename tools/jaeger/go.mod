module github.com/nodeplug/nodeplug/tools/jaeger

go 1.26
