module github.com/nodeplug/nodeplug/tools/compose

go 1.26
