// The CLI's commands: each is `int cmd_NAME(int argc, char **argv)` where
// argv[0] is the command name; returns the process exit code (0 ok, 1 runtime
// error, 2 usage error).
#ifndef MOLE_CLI_H
#define MOLE_CLI_H

int cmd_inspect(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_compress(int argc, char **argv);
int cmd_train_retain(int argc, char **argv);
int cmd_cachesim(int argc, char **argv);
int cmd_kld(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_plan(int argc, char **argv);

#endif
